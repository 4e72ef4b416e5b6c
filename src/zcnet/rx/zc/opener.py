"""open_receiver: pick a provider for a socket (or take the one asked for) and wrap it in a
Receiver; "auto" tries the providers in the order of zcnet.rx.zc.providers (zcrx on the
socket's device, then devmem, then soft) and says why."""

from __future__ import annotations

import logging
import socket
from typing import cast

from zcnet.errors import UsageError, ZcnetError, require_int
from zcnet.rx.zc.devnote import device_note
from zcnet.rx.zc.provider import NicProvider, Provider, build_or_close
from zcnet.rx.zc.providers import AUTO, PROVIDERS, Option, ProviderInfo
from zcnet.rx.zc.receiver import Receiver
from zcnet.sockcheck import require_tcp

log = logging.getLogger(__name__)

__all__ = ["PROVIDERS", "open_receiver"]


def open_receiver(sock: socket.socket | int, provider: str = "auto", *,
                  area_size: int = 64 << 20, buf_size: int = 64 << 10,
                  hugetlb: bool = False, dmabuf_fd: int | None = None,
                  ifname: str | None = None, queue: int | None = None,
                  max_held: float = 0.75, coalesce: bool = False,
                  debug: bool = False, incremental: bool = False,
                  rx_buf_len: int = 0) -> Receiver:
    """Open a zero-copy receiver on a connected TCP socket (checked first: a closed, listening,
    unconnected or non-TCP socket is a UsageError naming the problem).

    provider: "zcrx" (io_uring zero-copy receive; NIC with header split and queue API),
    "devmem" (devmem TCP into a dma-buf), "soft" (provided buffer ring; any recent kernel) or
    "auto": the best the socket's device supports, else soft; ``Receiver.why`` says which and why.
    area_size: bytes of the registered area; buf_size: soft provider's buffer size.
    incremental (soft): the kernel fills each buffer receive after receive (IOU_PBUF_RING_INC,
    6.12+), so big buffers waste nothing on small messages and chunks are neighbours.
    hugetlb: back the area with 2 MiB pages (warning and normal pages when none are free).
    dmabuf_fd: use this dma-buf as the area (zcrx, devmem; soft when the CPU can map it).
    ifname/queue: the NIC and receive queue that carry this flow (zcrx, devmem); found from
    the socket when omitted and the control plane can tell.
    "zcrx" on a device that cannot do it uses the kernel's copy mode where the kernel offers it
    (7.x: the kernel copies into the area; ``why`` says so); "auto" takes zcrx only on a device.
    rx_buf_len (zcrx): receive buffer size, a power of two >= the page size, where the kernel
    takes it (0: one page).
    """
    # Sizes are checked where they are used, which zcnet.aio's receivers reach too (Area,
    # buffer_count); rx_buf_len and queue only pass through here, to zcrx and devmem.
    require_int("rx_buf_len", rx_buf_len, "pass rx_buf_len= a power of two of bytes, or 0 for "
                "one page")
    if queue is not None:
        require_int("queue", queue, "pass queue= the queue id, or None to find it")
    if not 0.0 < max_held <= 1.0:
        raise UsageError(f"max_held must be in (0, 1], got {max_held}")
    fd = require_tcp(sock, "zero-copy receiver")
    options: dict[str, Option] = {
        "buf_size": buf_size, "hugetlb": hugetlb, "dmabuf_fd": dmabuf_fd, "ifname": ifname,
        "queue": queue, "incremental": incremental, "rx_buf_len": rx_buf_len}

    def opened(info: ProviderInfo, **extra: Option) -> Provider:
        return info.open(fd, area_size, **{k: options[k] for k in info.options}, **extra)

    def wrap(info: ProviderInfo, p: Provider, why: str) -> Receiver:
        if info.needs_nic and (note := device_note(cast(NicProvider, p).ifname or ifname)):
            why = f"{why}; {note}"
        return build_or_close(
            lambda: Receiver(sock, p, max_held=max_held, debug=debug, coalesce=coalesce, why=why),
            p.close, lambda: p.area_done(p.area))

    info = PROVIDERS.get(provider)
    if info is not None:
        p = opened(info)
        return wrap(info, p, info.requested.format(note=p.note))
    if provider != "auto":
        raise UsageError(f"unknown zero-copy provider {provider!r}",
                         f"choose one of {', '.join((*PROVIDERS, 'auto'))}")
    reasons: list[str] = []
    for info in AUTO:
        why = info.auto_why.format(reasons="; ".join(reasons))
        if info is AUTO[-1]:  # the last resort: no fallback left, its errors are the user's
            log.info("zero-copy provider for fd %d: %s", fd, why)
            return wrap(info, opened(info, **info.auto_options), why)
        if info.auto_needs is not None and options[info.auto_needs[0]] is None:
            reasons.append(f"{info.name}: {info.auto_needs[1]}")
            continue
        try:
            return wrap(info, opened(info, **info.auto_options), why)
        except ZcnetError as e:
            reasons.append(f"{info.name}: {e.message}")
    raise AssertionError("unreachable: the last provider is returned or raises")
