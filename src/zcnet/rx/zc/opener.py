"""open_receiver: pick a provider for a socket (or take the one asked for) and wrap it in a
Receiver; "auto" tries zcrx on the socket's device, then devmem, then soft, and says why."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from zcnet.errors import UsageError, ZcnetError, require_int
from zcnet.rx.zc.devmem import open_devmem
from zcnet.rx.zc.devnote import device_note
from zcnet.rx.zc.provider import Provider, build_or_close
from zcnet.rx.zc.receiver import Receiver
from zcnet.rx.zc.soft import open_soft
from zcnet.rx.zc.zcrx import open_zcrx
from zcnet.sockcheck import require_tcp

log = logging.getLogger(__name__)

# The providers open_receiver can take by name, in the order "auto" tries them.
_OPENERS: dict[str, Callable[..., Provider]] = {
    "zcrx": open_zcrx, "devmem": open_devmem, "soft": open_soft}
PROVIDERS = tuple(_OPENERS)


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
    mem: dict[str, Any] = {"hugetlb": hugetlb, "dmabuf_fd": dmabuf_fd}
    nic: dict[str, Any] = {"ifname": ifname, "queue": queue}
    soft_kw: dict[str, Any] = {"buf_size": buf_size, "hugetlb": hugetlb,
                               "incremental": incremental, "dmabuf_fd": dmabuf_fd}

    def wrap(p: Provider, why: str) -> Receiver:
        if p.name in ("zcrx", "devmem") and (note := device_note(getattr(p, "ifname", ifname))):
            why = f"{why}; {note}"
        return build_or_close(
            lambda: Receiver(sock, p, max_held=max_held, debug=debug, coalesce=coalesce, why=why),
            p.close, p.area.close)

    if provider == "soft":
        return wrap(_open("soft", fd, area_size, **soft_kw), "soft provider requested")
    if provider == "zcrx":
        p = _open("zcrx", fd, area_size, **mem, **nic, rx_buf_len=rx_buf_len)
        return wrap(p, f"zcrx requested; {p.note}")
    if provider == "devmem":
        return wrap(_open("devmem", fd, area_size, dmabuf_fd=dmabuf_fd, **nic),
                    "devmem requested")
    if provider != "auto":
        raise UsageError(f"unknown zero-copy provider {provider!r}",
                         f"choose one of {', '.join((*PROVIDERS, 'auto'))}")
    reasons = []
    try:
        return wrap(_open("zcrx", fd, area_size, **mem, **nic, copy=False),
                    "zcrx: the socket's device supports it")
    except ZcnetError as e:
        reasons.append(f"zcrx: {e.message}")
    if dmabuf_fd is None:
        reasons.append("devmem: no dma-buf given")
    else:
        try:
            return wrap(_open("devmem", fd, area_size, dmabuf_fd=dmabuf_fd, **nic),
                        "devmem: " + "; ".join(reasons))
        except ZcnetError as e:
            reasons.append(f"devmem: {e.message}")
    why = "soft, because " + "; ".join(reasons)
    log.info("zero-copy provider for fd %d: %s", fd, why)
    return wrap(_open("soft", fd, area_size, **soft_kw), why)


def _open(name: str, fd: int, area_size: int, **kw: Any) -> Provider:
    return _OPENERS[name](fd, area_size, **kw)
