"""zcrx flows of a server session: the session registers each device queue once and its flow
workers (one process per flow) import it (zcnet.rx.zc.zcrx_procs).

A second registration of a bound queue is EEXIST, so workers that each registered their
flow's queue would refuse each other. Instead the session (its thread: a zcrx ring is
single-issuer) hosts one zcrx per queue of the flow's ``queue``/``queues`` and hands the
worker a ZcrxHandoff per queue; the worker joins the one its connection arrived on. A
kernel without ZCRX_REG_IMPORT (before 6.19) keeps the old way for one queue (the worker
registers it; a second flow on it is refused with the reason) and refuses a queue set.
Copy mode needs no host: each worker's ifq has no device queue. That holds for no queue named
and for a device that cannot do zcrx (a veth lab) when the kernel has copy mode: the worker
falls back to it by itself, as a lone flow does.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Mapping

from zcnet.bench.proto import UNSUPPORTED_HERE, OptionValue
from zcnet.bench.worker import SessionError
from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.rx.engine import EngineOptions
from zcnet.rx.zc.engines import ZcrxEngine
from zcnet.rx.zc.zcrx_export import IMPORT_SINCE
from zcnet.rx.zc.zcrx_ifq import queue_key
from zcnet.rx.zc.zcrx_procs import HostedQueue, ZcrxHandoff
from zcnet.rx.zc.zcrx_reg import kernel_offers

# This thread's hosted queues (each session is a thread) and how many memberships hold each.
_LOCAL = threading.local()


def _hosts() -> dict[tuple[int, ...], tuple[HostedQueue, list[int]]]:
    try:
        return _LOCAL.hosts  # type: ignore[no-any-return]
    except AttributeError:
        _LOCAL.hosts = {}
        return _LOCAL.hosts  # type: ignore[no-any-return]


class Membership:
    """One flow's hold on the session's hosted queues: a handoff per queue, taken back (and
    the queue closed with its last membership) by ``quit`` once the worker is gone."""

    def __init__(self) -> None:
        self.parts: list[tuple[tuple[int, ...], HostedQueue, ZcrxHandoff]] = []

    def handoffs(self) -> tuple[ZcrxHandoff, ...]:
        return tuple(h for _, _, h in self.parts)

    def quit(self) -> None:
        parts, self.parts = self.parts, []
        with contextlib.ExitStack() as undo:
            for key, host, h in parts:
                undo.callback(_let_go, key, host, h)


def _let_go(key: tuple[int, ...], host: HostedQueue, h: ZcrxHandoff) -> None:
    host.taken_back(h)
    hosts = _hosts()
    got = hosts.get(key)
    if got is not None and got[0] is host:
        got[1][0] -= 1
        if got[1][0] == 0:
            del hosts[key]
            host.close()


def join(engine: str, options: Mapping[str, OptionValue], read_size: int
         ) -> Membership | None:
    """The session's hold on the queues a zcrx flow with ``options`` receives on, or None
    (not zcrx, copy mode, or a kernel without import for one queue: the worker registers it
    itself). A refusal is the reply the worker would have given."""
    if engine != ZcrxEngine.name:
        return None
    try:
        opts = EngineOptions.from_mapping(options, bufsize=read_size)
        queues = opts.queue_set()
        if opts.ifname is None or not queues:
            return None
        if not kernel_offers().imports:
            if len(queues) == 1:
                return None
            raise SessionError("unsupported", f"engine zcrx{UNSUPPORTED_HERE}zcrx over queues "
                               f"{opts.queues} needs ZCRX_REG_IMPORT (Linux {IMPORT_SINCE}+); "
                               "name one queue")
        m = Membership()
        with contextlib.ExitStack() as undo:
            undo.callback(m.quit)
            try:
                for q in queues:
                    m.parts.append(_handoff(opts, q, ZcrxEngine.area_buffers))
            except Unsupported:
                # The device cannot do zcrx: one queue falls back to copy mode in the worker
                # (its cell says why); a queue set has nothing to fall back to.
                if len(queues) == 1 and kernel_offers().copy_mode:
                    return None
                raise
            undo.pop_all()
        return m
    except UsageError as e:
        raise SessionError("invalid", f"engine {engine}: {e}") from None
    except ZcnetError as e:
        raise SessionError("unsupported", f"engine {engine}{UNSUPPORTED_HERE}{e}") from None


def _handoff(opts: EngineOptions, queue: int, buffers: int
             ) -> tuple[tuple[int, ...], HostedQueue, ZcrxHandoff]:
    assert opts.ifname is not None
    try:
        ifindex = socket.if_nametoindex(opts.ifname)
    except OSError:
        raise UsageError(f"no interface named {opts.ifname!r} in the server's network "
                         "namespace", "name one of `ip link` there") from None
    key = queue_key(ifindex, queue)
    hosts = _hosts()
    got = hosts.get(key)
    if got is None:
        host = HostedQueue(opts.ifname, queue, opts.area_bytes(buffers),
                           rx_buf_len=opts.zc_rx_buf_len)
        got = hosts[key] = (host, [0])
    host, refs = got
    h = host.handoff()
    refs[0] += 1
    return key, host, h
