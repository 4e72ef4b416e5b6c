"""MSG_ZEROCOPY completions: reading the error queue, coalescing id ranges, tracking buffers.

Some facts about MSG_ZEROCOPY (Documentation/networking/msg_zerocopy.rst):
- After ``SO_ZEROCOPY=1`` every send() with MSG_ZEROCOPY that queues data takes the next 32-bit
  id of the socket (0, 1, 2, ..., wrapping). A call that fails takes none.
- When the kernel no longer references a send's pages it queues a notification on the socket's
  error queue: a ``sock_extended_err`` with origin SO_EE_ORIGIN_ZEROCOPY, errno 0, and the
  inclusive id range ``[ee_info, ee_data]``; consecutive completions are merged into one range
  while they wait, so one message may release many sends. The range may wrap past 2**32.
- ``ee_code`` has SO_EE_CODE_ZEROCOPY_COPIED when the kernel copied after all (loopback and veth
  into another namespace always do: the receiver must not see the sender's pages).
- The error queue is read with recvmsg(MSG_ERRQUEUE); poll reports it as POLLERR.
"""

from __future__ import annotations

import errno
import select
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from zcnet.uapi.errqueue import (
    IP_RECVERR,
    IPV6_RECVERR,
    SIZEOF_SOCK_EXTENDED_ERR,
    SO_EE_CODE_ZEROCOPY_COPIED,
    SO_EE_ORIGIN_ZEROCOPY,
    SOL_IP,
    SOL_IPV6,
    sock_extended_err,
)
from zcnet.uapi.socket import MSG_DONTWAIT, MSG_ERRQUEUE

ID_MOD = 1 << 32
_RECVERR = {(SOL_IP, IP_RECVERR), (SOL_IPV6, IPV6_RECVERR)}
_CMSG_SPACE = socket.CMSG_SPACE(SIZEOF_SOCK_EXTENDED_ERR + 28)  # + the offender sockaddr_in6


@dataclass(frozen=True)
class ZcRange:
    """Sends ``lo .. hi`` (inclusive, modulo 2**32) completed; ``copied`` if the kernel copied."""

    lo: int
    hi: int
    copied: bool

    def __len__(self) -> int:
        return (self.hi - self.lo) % ID_MOD + 1


def parse_cmsgs(ancdata: Iterable[tuple[int, int, bytes]]) -> list[ZcRange]:
    """The zero-copy completion ranges in one recvmsg's ancillary data (others are ignored)."""
    out = []
    for level, kind, data in ancdata:
        if (level, kind) not in _RECVERR or len(data) < SIZEOF_SOCK_EXTENDED_ERR:
            continue
        ee = sock_extended_err.from_buffer_copy(data[:SIZEOF_SOCK_EXTENDED_ERR])
        if ee.ee_origin != SO_EE_ORIGIN_ZEROCOPY or ee.ee_errno != 0:
            continue
        out.append(ZcRange(ee.ee_info, ee.ee_data,
                           bool(ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED)))
    return out


def coalesce(ranges: Iterable[ZcRange], base: int = 0) -> list[ZcRange]:
    """Merge ranges that touch or overlap and share ``copied``; ids are ordered relative to
    ``base`` (the oldest id still outstanding), so a range that wraps past 2**32 sorts right."""
    keyed = sorted(ranges, key=lambda r: ((r.lo - base) % ID_MOD, r.copied))
    merged: list[ZcRange] = []
    for r in keyed:
        if merged:
            last = merged[-1]
            last_end = (last.hi - base) % ID_MOD
            start = (r.lo - base) % ID_MOD
            if last.copied == r.copied and start <= last_end + 1:
                end = max(last_end, (r.hi - base) % ID_MOD)
                merged[-1] = ZcRange(last.lo, (base + end) % ID_MOD, last.copied)
                continue
        merged.append(r)
    return merged


def read_completions(sock: socket.socket) -> list[ZcRange]:
    """Drain the socket's error queue without blocking; returns the completion ranges."""
    out: list[ZcRange] = []
    while True:
        try:
            _, ancdata, _, _ = sock.recvmsg(0, _CMSG_SPACE, MSG_ERRQUEUE | MSG_DONTWAIT)
        except BlockingIOError:
            return out
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise
        out.extend(parse_cmsgs(ancdata))


def wait_completions(sock: socket.socket, timeout_ms: int, *,
                     writable: bool = False) -> list[ZcRange]:
    """Wait up to ``timeout_ms`` for the error queue to be readable (or, with ``writable``, for
    send-buffer space too), then drain it."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLERR | (select.POLLOUT if writable else 0))
    poller.poll(timeout_ms)
    return read_completions(sock)


class DoubleRelease(RuntimeError):
    """A completion named a send id that was not outstanding: the bookkeeping is broken."""


class ZcTracker:
    """Maps outstanding send ids to the buffer slot they read from.

    ``submitted(slot)`` takes the next id; ``complete(range)`` returns the slots whose last
    outstanding send it covers, so a slot is released exactly once, after all its sends.
    """

    def __init__(self, first_id: int = 0) -> None:
        self.next_id = first_id % ID_MOD
        self.oldest = self.next_id
        self._slot_of: dict[int, int] = {}
        self._refs: dict[int, int] = {}
        self.zerocopy = 0
        self.copied = 0

    @property
    def outstanding(self) -> int:
        return len(self._slot_of)

    def refs(self, slot: int) -> int:
        return self._refs.get(slot, 0)

    def submitted(self, slot: int) -> int:
        sid = self.next_id
        self._slot_of[sid] = slot
        self._refs[slot] = self._refs.get(slot, 0) + 1
        self.next_id = (sid + 1) % ID_MOD
        return sid

    def complete(self, r: ZcRange) -> list[int]:
        released = []
        for i in range(len(r)):
            sid = (r.lo + i) % ID_MOD
            slot = self._slot_of.pop(sid, None)
            if slot is None:
                raise DoubleRelease(f"completion for send id {sid}, which is not outstanding")
            self._refs[slot] -= 1
            if not self._refs[slot]:
                del self._refs[slot]
                released.append(slot)
        if r.copied:
            self.copied += len(r)
        else:
            self.zerocopy += len(r)
        if self._slot_of:
            self.oldest = min(self._slot_of, key=lambda s: (s - self.oldest) % ID_MOD)
        else:
            self.oldest = self.next_id
        return released
