"""zcrx registration: what the kernel offers, the IORING_REGISTER_ZCRX_IFQ structs, and its
errors translated into what to do.

Some facts about registration:

- The kernel validates in this order: CAP_NET_ADMIN (EPERM), ring flags and reserved fields
  (EINVAL), the region, the interface (ENODEV), the device's DMA parent (EOPNOTSUPP: veth and lo
  have none), the area (pins pages, RLIMIT_MEMLOCK -> ENOMEM), then the queue API:
  EOPNOTSUPP without queue management ops, ERANGE past the last queue, EINVAL with
  tcp-data-split off or hds-thresh non-zero, EEXIST when the queue already has a memory provider
  (an earlier zcrx or devmem binding not yet torn down) or an XDP program, EBUSY under AF_XDP.
- What a kernel offers is asked with IORING_REGISTER_QUERY (IO_URING_QUERY_ZCRX, no ring
  needed); kernels before 7.x answer with a negative result or an error, read as "nothing".
- 7.x kernels (ZCRX_FEATURE_EVENT) count their copy fallback in a ``struct zcrx_stats`` that
  registration may place in the refill region (``zcrx_event_desc`` with
  ZCRX_EVENT_DESC_FLAG_STATS; IO_URING_QUERY_ZCRX_EVENT gives its size and alignment, and the
  offset must lie past the ring's entries). ``copy_bytes`` counts the page fragments the
  kernel copied into the area (io_zcrx_copy_frag, 7.3); payload it copies out of an skb's
  linear part is not counted, which a header-split device never puts there.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import resource
from dataclasses import dataclass

from zcnet.caps import has_caps
from zcnet.errors import Unsupported, UsageError, ZcnetError, cap_hint
from zcnet.rx.zc.area import PAGE_SIZE, Area
from zcnet.uapi import io_uring as u
from zcnet.uapi.capability import CAP_IPC_LOCK
from zcnet.uring.mem import Mapping, page_align
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import io_uring_register

IO_RQ_MAX_ENTRIES = 32768


@dataclass(frozen=True)
class Offers:
    """What this kernel's zcrx takes (IO_URING_QUERY_ZCRX); all zero before 7.x."""

    register_flags: int = 0
    features: int = 0
    nr_ctrl_opcodes: int = 0

    @property
    def copy_mode(self) -> bool:
        return bool(self.register_flags & u.ZCRX_REG_NODEV) and self.nr_ctrl_opcodes > 0

    @property
    def imports(self) -> bool:
        """One ifq on several rings: ZCRX_CTRL_EXPORT and ZCRX_REG_IMPORT (6.19)."""
        return (bool(self.register_flags & u.ZCRX_REG_IMPORT)
                and self.nr_ctrl_opcodes > u.ZCRX_CTRL_EXPORT)

    @property
    def add_area(self) -> bool:
        """More areas for a registered ifq: ZCRX_CTRL_ADD_AREA (7.3)."""
        return self.nr_ctrl_opcodes > u.ZCRX_CTRL_ADD_AREA

    @property
    def rx_buf_len(self) -> bool:
        return bool(self.features & u.ZCRX_FEATURE_RX_PAGE_SIZE)

    @property
    def events(self) -> bool:
        return bool(self.features & u.ZCRX_FEATURE_EVENT)


@dataclass(frozen=True)
class StatsLayout:
    """Where a kernel's ``struct zcrx_stats`` may go in the refill region."""

    size: int
    alignment: int

    def offset(self, region_size: int) -> int:
        """The stats at the region's end (the ring's entries come first)."""
        return (region_size - self.size) // self.alignment * self.alignment


STATS_SINCE = "7.2"  # the first headers with ZCRX_FEATURE_EVENT and struct zcrx_stats


def no_stats_reason() -> str:
    return (f"kernel {os.uname().release} lacks zcrx stats (ZCRX_FEATURE_EVENT, "
            f"needs >= {STATS_SINCE})")


def _query(op: int, answer: ctypes.Structure) -> bool:
    """IORING_REGISTER_QUERY for one op into ``answer``; False when the kernel lacks either."""
    hdr = u.io_uring_query_hdr(query_data=ctypes.addressof(answer), query_op=op,
                               size=ctypes.sizeof(answer))
    try:
        io_uring_register(-1, u.IORING_REGISTER_QUERY, hdr, 0)
    except OSError:  # no query opcode (before 6.18)
        return False
    return hdr.result >= 0  # 6.18 knows the query but not the zcrx ops (EOPNOTSUPP)


@functools.cache
def kernel_offers() -> Offers:
    """Ask the running kernel (once per process) what its zcrx supports."""
    q = u.io_uring_query_zcrx()
    if not _query(u.IO_URING_QUERY_ZCRX, q):
        return Offers()
    return Offers(int(q.register_flags), int(q.features), int(q.nr_ctrl_opcodes))


@functools.cache
def kernel_stats_layout() -> StatsLayout | None:
    """Size and alignment of the kernel's ``struct zcrx_stats``; None without zcrx stats."""
    if not kernel_offers().events:
        return None
    q = u.io_uring_query_zcrx_event()
    if not _query(u.IO_URING_QUERY_ZCRX_EVENT, q) or q.stats_size < ctypes.sizeof(u.zcrx_stats):
        return None
    return StatsLayout(int(q.stats_size), max(int(q.stats_off_alignment), 1))


def check_rx_buf_len(rx_buf_len: int, offers: Offers, copy: bool) -> None:
    """UsageError/Unsupported for an rx_buf_len the kernel would refuse (0: its default)."""
    if not rx_buf_len:
        return
    if rx_buf_len < PAGE_SIZE or rx_buf_len & (rx_buf_len - 1):
        raise UsageError(f"rx_buf_len must be a power of two >= {PAGE_SIZE}, got {rx_buf_len}")
    if not offers.rx_buf_len:
        raise Unsupported("this kernel's zcrx has no rx_buf_len (ZCRX_FEATURE_RX_PAGE_SIZE, "
                          "7.x kernels)", "leave rx_buf_len out: buffers are one page")
    if copy and rx_buf_len != PAGE_SIZE:
        raise Unsupported(f"zcrx copy mode fills {PAGE_SIZE}-byte buffers only; rx_buf_len "
                          f"{rx_buf_len} needs a NIC queue", "leave rx_buf_len out")


def refill_region_size(rq_entries: int) -> int:
    """Bytes of the refill region: the rqes plus a page for head/tail (liburing's sizing)."""
    return page_align(rq_entries * ctypes.sizeof(u.io_uring_zcrx_rqe) + PAGE_SIZE)


@dataclass
class Registration:
    """The structs of one IORING_REGISTER_ZCRX_IFQ call, kept alive (the kernel writes back)."""

    ifq: u.io_uring_zcrx_ifq_reg
    area: u.io_uring_zcrx_area_reg
    region: u.io_uring_region_desc
    region_mem: Mapping | None  # our memory for a user region, None for a kernel one
    events: u.zcrx_event_desc | None = None  # where the kernel's copy counters go, if asked

    @property
    def stats_offset(self) -> int | None:
        """Offset of the kernel's ``struct zcrx_stats`` in the refill region, if asked for."""
        return None if self.events is None else int(self.events.stats_offset)

    @classmethod
    def build(cls, area: Area, ifindex: int, queue: int, rq_entries: int,
              user_region: bool = True, *, nodev: bool = False,
              rx_buf_len: int = 0, stats: StatsLayout | None = None,
              region: Mapping | None = None) -> Registration:
        """``nodev``: copy mode (ifindex and queue must be 0, the kernel insists).
        ``stats``: have the kernel count its copies in the region (kernel_stats_layout()).
        ``region``: memory for the user region (released with it; ``region_size`` bytes),
        e.g. a shared mapping other processes map too; else an anonymous one."""
        if queue < 0:
            raise UsageError(f"queue must be >= 0, got {queue}")
        if not 0 < rq_entries <= IO_RQ_MAX_ENTRIES:
            raise UsageError(f"refill ring entries must be 1..{IO_RQ_MAX_ENTRIES}")
        entries = 1 << (rq_entries - 1).bit_length()  # the kernel rounds up the same way
        size = refill_region_size(entries)
        areg = u.io_uring_zcrx_area_reg(len=area.size)
        if area.dmabuf_fd is not None:
            areg.flags = u.IORING_ZCRX_AREA_DMABUF
            areg.dmabuf_fd = area.dmabuf_fd  # addr is the offset into the dma-buf: 0
        else:
            areg.addr = area.addr
        rd = u.io_uring_region_desc(size=size)
        mem = None
        if region is not None:
            if region.size < size:
                raise UsageError(f"a refill region of {size} bytes does not fit in "
                                 f"{region.size}")
            mem = region
        elif user_region:
            mem = Mapping.anonymous(size)
        if mem is not None:
            rd.user_addr = mem.addr
            rd.flags = u.IORING_MEM_REGION_TYPE_USER
        ifq = u.io_uring_zcrx_ifq_reg(if_idx=ifindex, if_rxq=queue, rq_entries=entries,
                                      area_ptr=ctypes.addressof(areg),
                                      region_ptr=ctypes.addressof(rd), rx_buf_len=rx_buf_len,
                                      flags=u.ZCRX_REG_NODEV if nodev else 0)
        events = None
        if stats is not None:
            events = u.zcrx_event_desc(flags=u.ZCRX_EVENT_DESC_FLAG_STATS,
                                       stats_offset=stats.offset(size))
            ifq.event_desc = ctypes.addressof(events)
        return cls(ifq, areg, rd, mem, events)

    def locked_bytes(self) -> int:
        return int(self.region.size) + (0 if self.area.flags else int(self.area.len))

    def release(self) -> None:
        if self.region_mem is not None:
            self.region_mem.close()
            self.region_mem = None


# errno -> (message, hint); {ifname}, {queue}, {ifindex} are filled in.
REGISTER_ERRORS: dict[int, tuple[type[ZcnetError], str, str]] = {
    errno.EPERM: (ZcnetError, "zcrx registration needs CAP_NET_ADMIN",
                  cap_hint("CAP_NET_ADMIN")),
    errno.EOPNOTSUPP: (Unsupported,
                       "device {ifname} lacks queue management ops or header-data split, "
                       "so zcrx cannot take over its queue {queue}",
                       "use a NIC whose driver supports zcrx (queue API and tcp-data-split), "
                       "or provider 'soft'"),
    errno.EEXIST: (ZcnetError,
                   "queue {queue} of {ifname} already has a memory provider: a zcrx or devmem "
                   "binding of another process or program (one per queue), one not yet "
                   "released, or an XDP program",
                   "receive all of the queue's connections in one process (zcnet.rx.zc.zcrx."
                   "open_zcrx_queue; threads import it), close the earlier receiver and its "
                   "ring, or detach XDP"),
    errno.EBUSY: (ZcnetError, "queue {queue} of {ifname} is in use by an AF_XDP socket",
                  "close the AF_XDP socket or pick another queue"),
    errno.ERANGE: (UsageError, "{ifname} has no rx queue {queue}",
                   "pick a queue below the channel count (ethtool -l {ifname})"),
    errno.ENODEV: (UsageError, "no interface with index {ifindex} in this network namespace",
                   "register from the namespace that holds the NIC"),
    errno.EINVAL: (ZcnetError,
                   "zcrx registration rejected as invalid (EINVAL): {ifname} has "
                   "tcp-data-split off or hds-thresh above 0, or the request is malformed",
                   "ethtool -G {ifname} tcp-data-split on hds-thresh 0"),
}


def explain(err: OSError, *, ifname: str, ifindex: int, queue: int, locked: int) -> ZcnetError:
    """The user-facing error for a failed registration; errno kept on ``.errno``."""
    if err.errno == errno.ENOMEM:
        exc = memlock_error(locked) or ZcnetError(
            f"zcrx registration ran out of memory pinning {locked} bytes", None)
    elif err.errno in REGISTER_ERRORS:
        cls, msg, hint = REGISTER_ERRORS[err.errno]
        fill = {"ifname": ifname, "queue": queue, "ifindex": ifindex}
        exc = cls(msg.format(**fill), hint.format(**fill))
    else:
        exc = ZcnetError(f"zcrx registration on {ifname} queue {queue} failed: {err.strerror}")
    exc.errno = err.errno  # type: ignore[attr-defined]
    return exc


def memlock_error(needed: int, limit: int | None = None,
                  privileged: bool | None = None) -> ZcnetError | None:
    """The error when ``needed`` locked bytes exceed RLIMIT_MEMLOCK (CAP_IPC_LOCK lifts it)."""
    if privileged is None:
        privileged = has_caps(CAP_IPC_LOCK)
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    if privileged or limit == resource.RLIM_INFINITY or needed <= limit:
        return None
    e = ZcnetError(f"RLIMIT_MEMLOCK is {limit} bytes but zcrx must lock {needed} bytes "
                   "(area and refill ring)",
                   f"raise the limit to at least {-(-needed // 1024)} KiB (ulimit -l, "
                   "LimitMEMLOCK=) or run with CAP_IPC_LOCK")
    e.errno = errno.ENOMEM  # type: ignore[attr-defined]
    return e


def register_ifq(ring: Ring, reg: Registration, *, ifname: str = "?") -> None:
    """IORING_REGISTER_ZCRX_IFQ with errors translated (see REGISTER_ERRORS)."""
    try:
        ring.register(u.IORING_REGISTER_ZCRX_IFQ, reg.ifq, 1)
    except OSError as e:
        raise explain(e, ifname=ifname, ifindex=reg.ifq.if_idx, queue=reg.ifq.if_rxq,
                      locked=reg.locked_bytes()) from e
