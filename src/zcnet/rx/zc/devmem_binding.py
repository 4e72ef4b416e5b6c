"""One devmem binding (a dma-buf bound to a set of RX queues) shared by every connection whose
flow lands on those queues, and each connection's share of it.

Some facts (net/core/devmem.c, net/ipv4/tcp.c, net/core/sock.c of Linux 7.3):

- ``bind-rx`` binds one dma-buf to a bitmap of queues of one device, for as long as the netlink
  socket that asked lives. A second bind-rx on a bound queue is EEXIST ("designated queue
  already memory provider bound"), whoever made the first one. So a process binds a queue set
  once (``acquire`` keeps one binding per namespace, device and queue set) and every socket on
  those queues reads from it: the kernel gives each socket fragments with tokens from that
  socket's own table, and SO_DEVMEM_DONTNEED is per socket. Nothing else is per socket.
- Bound without an rx page size, the dma-buf is cut into pages (net_iovs); every fragment takes
  one token and holds its whole page, however few bytes it carries (1448 of 4096 at MTU 1500).
- The pages are one pool for every socket: pages an application holds, and pages queued in a
  socket nobody reads, are gone for all. So each connection (a member) gets a share:
  ``usable = size - reserve`` (reserve: the device's RX ring, pages posted or cached ahead),
  ``share = usable // members``, of which the member may hold half in pages (``held_limit``)
  and its socket may queue the other half (SO_RCVBUF = share / 4: the kernel doubles it and
  counts truesize, a page per fragment). A join that would leave several members a share under
  MIN_SHARE each is refused. A member over its share stops reading its socket: its TCP window
  closes, nobody else's.
- Destroying a socket puts the pages it still holds back into the pool
  (``tcp_release_user_frags``), where the NIC refills them while the application may still
  read them. So a member closed with chunks held keeps its socket until they come back
  (zcnet.rx.zc.devmem), and the binding goes with the last member and the last held page.
- Members in other processes (a benchmark's flow workers): the process that binds hands out a
  ``SharedBinding`` (the dma-buf and a one-page member count, as fds; multiprocessing passes
  them with SCM_RIGHTS); the other process maps both and reads its socket only. Shares follow
  the count page, which only the binding's owner writes.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing import reduction

from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.nic import ethtool, netdev
from zcnet.nic.device import Device
from zcnet.nic.genl import NetlinkError
from zcnet.rx.zc.area import UDMABUF_DEV, udmabuf_create
from zcnet.rx.zc.provider import build_or_close

PAGE = mmap.PAGESIZE        # the net_iov size of a bind-rx without an rx page size
MIN_SHARE = 1 << 20         # a member's least share with others: half held, half queued
_COUNT = struct.Struct("=I")  # the count page: members of the binding, written by its owner

__all__ = ["MIN_SHARE", "DevmemBinding", "SharedBinding", "acquire", "bind_rx", "bound_here",
           "probe_device"]


def _netns() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def queue_list(queues: Iterable[int]) -> str:
    return ",".join(map(str, queues))


@dataclass
class SharedBinding:
    """What a process holding a binding gives a process that receives on it. Pickling it (to
    a multiprocessing child) sends both fds along; the receiving side owns its copies."""

    dmabuf_fd: int
    count_fd: int
    size: int
    reserve: int
    ifname: str
    queues: tuple[int, ...]
    binding_id: int

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_rebuild, (reduction.DupFd(self.dmabuf_fd), reduction.DupFd(self.count_fd),
                           self.size, self.reserve, self.ifname, self.queues, self.binding_id))

    def close(self) -> None:
        for fd in (self.dmabuf_fd, self.count_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _rebuild(dmabuf: reduction.DupFd, count: reduction.DupFd, *rest: object) -> SharedBinding:
    return SharedBinding(dmabuf.detach(), count.detach(), *rest)  # type: ignore[arg-type]


class DevmemBinding:
    """A dma-buf bound to ``queues`` of ``ifname``: its members (connections, counted on the
    count page) and holders (members, plus closed members whose chunks are still held). The
    owner (``owner``: it made the bind-rx) counts members; a binding imported from another
    process only holds. Closed when the last holder goes."""

    def __init__(self, *, ifname: str, queues: tuple[int, ...], dmabuf_fd: int, size: int,
                 reserve: int, binding_id: int, count_fd: int,
                 netlink: netdev.DmabufBinding | None, key: tuple[int, str, tuple[int, ...]]
                 | None) -> None:
        self.ifname = ifname
        self.queues = queues
        self.dmabuf_fd = dmabuf_fd
        self.size = size
        self.reserve = reserve
        self.id = binding_id
        self.owner = netlink is not None
        self._count_fd = count_fd
        self._count = mmap.mmap(count_fd, PAGE)
        self._netlink = netlink
        self._key = key
        self._lock = threading.Lock()
        self.holders = 0
        self.closed = False

    # --- shares ---------------------------------------------------------------------------
    @property
    def members(self) -> int:
        return int(_COUNT.unpack_from(self._count, 0)[0]) if not self.closed else 0

    @property
    def usable(self) -> int:
        return max(0, self.size - self.reserve)

    def share(self, members: int | None = None) -> int:
        """Bytes of the dma-buf each member may take (held pages plus its socket's queue)."""
        return self.usable // max(1, self.members if members is None else members)

    def held_limit(self) -> int:
        """Pages (tokens) a member may hold: half its share."""
        return max(1, self.share() // 2 // PAGE)

    def rcvbuf(self) -> int:
        """SO_RCVBUF for a member's socket: the kernel doubles it, so its queue takes the other
        half of the share."""
        return max(PAGE, self.share() // 4)

    def describe(self) -> str:
        return f"queue{'s' if len(self.queues) > 1 else ''} {queue_list(self.queues)} of " \
               f"{self.ifname}"

    # --- members and holders --------------------------------------------------------------
    def join(self) -> None:
        """A new member (owner: counted, refused when the shares would get too small)."""
        with self._lock:
            if self.closed:
                raise ZcnetError(f"the devmem binding of {self.describe()} is closed")
            if self.owner:
                n = self.members + 1
                if n > 1 and self.share(n) < MIN_SHARE:  # alone, it has the whole dma-buf
                    raise UsageError(
                        f"devmem on {self.describe()}: its {self.size >> 20} MiB dma-buf "
                        f"({self.reserve >> 20} MiB kept for the device's RX ring) gives {n} "
                        f"connections {self.share(n) >> 10} KiB each, under the "
                        f"{MIN_SHARE >> 20} MiB a connection needs",
                        f"use a dma-buf (area) of at least "
                        f"{(self.reserve + n * MIN_SHARE) >> 20} MiB for the first connection "
                        f"on these queues, or fewer connections")
                _COUNT.pack_into(self._count, 0, n)
            self.holders += 1

    def leave(self) -> None:
        """A member stops receiving (its chunks may still be held: see ``release``); the
        others' shares grow."""
        with self._lock:
            if self.owner and not self.closed:
                _COUNT.pack_into(self._count, 0, max(0, self.members - 1))

    def release(self) -> None:
        """A holder is done (it left and holds no chunk); the last one closes the binding."""
        # Under the registry's lock: an acquire of these queues meanwhile finds either this
        # binding open or none (and then the queues free again).
        with _REGISTRY_LOCK, self._lock:
            self.holders = max(0, self.holders - 1)
            if self.holders > 0 or self.closed:
                return
            if self._key is not None and _REGISTRY.get(self._key) is self:
                del _REGISTRY[self._key]
            self.free()

    def quit(self) -> None:
        """``leave`` and ``release``: a member that never received (a failed open)."""
        self.leave()
        self.release()

    def shared(self) -> SharedBinding:
        """The handle another process receives on (owner only)."""
        return SharedBinding(self.dmabuf_fd, self._count_fd, self.size, self.reserve,
                             self.ifname, self.queues, self.id)

    def free(self) -> None:
        """Unbind (owner) and close the fds and the count page (``release`` does it when the
        last holder goes)."""
        self.closed = True
        with contextlib.ExitStack() as undo:
            undo.callback(os.close, self.dmabuf_fd)
            undo.callback(os.close, self._count_fd)
            undo.callback(self._count.close)
            if self._netlink is not None:
                undo.callback(self._netlink.close)   # unbinds: the queues are free again

    @classmethod
    def imported(cls, handle: SharedBinding) -> DevmemBinding:
        """A binding another process holds (``SharedBinding``); this one takes the handle's
        fds and only reads its sockets."""
        return build_or_close(lambda: cls(
            ifname=handle.ifname, queues=handle.queues, dmabuf_fd=handle.dmabuf_fd,
            size=handle.size, reserve=handle.reserve, binding_id=handle.binding_id,
            count_fd=handle.count_fd, netlink=None, key=None), handle.close)


# --- the process's bindings -----------------------------------------------------------------

_REGISTRY: dict[tuple[int, str, tuple[int, ...]], DevmemBinding] = {}
_REGISTRY_LOCK = threading.Lock()


def bound_here(ifname: str, queues: Iterable[int]) -> DevmemBinding | None:
    """This process's binding of exactly ``queues`` of ``ifname`` (this thread's namespace)."""
    with _REGISTRY_LOCK:
        return _REGISTRY.get((_netns(), ifname, tuple(sorted(set(queues)))))


def acquire(ifname: str, queues: Iterable[int], area_size: int,
            dmabuf_fd: int | None = None) -> DevmemBinding:
    """Join this process's binding of ``queues`` of ``ifname``, binding them first when none
    exists (a udmabuf of ``area_size`` bytes, or the caller's ``dmabuf_fd``, which stays the
    caller's). The caller owns one membership: ``leave`` and ``release`` it (``quit``)."""
    qs = tuple(sorted(set(queues)))
    if not qs:
        raise UsageError("devmem needs at least one queue", "pass queue= or queues=")
    key = (_netns(), ifname, qs)
    with _REGISTRY_LOCK:
        b = _REGISTRY.get(key)
        if b is not None:
            if dmabuf_fd is not None and not _same_file(dmabuf_fd, b.dmabuf_fd):
                raise UsageError(f"devmem on {b.describe()}: this process bound another "
                                 "dma-buf to them", "omit dmabuf_fd to share that binding")
            b.join()
            return b
        for (ns, name, other), ob in _REGISTRY.items():
            if ns == key[0] and name == ifname and set(other) & set(qs):
                raise UsageError(
                    f"devmem on queues {queue_list(qs)} of {ifname}: this process has "
                    f"{ob.describe()} bound already",
                    f"receive on queues {queue_list(other)} (one binding per queue set)")
        b = _bind(key, ifname, qs, area_size, dmabuf_fd)
        build_or_close(b.join, b.free)  # nobody could join: it goes at once
        _REGISTRY[key] = b
    return b


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def bind_rx(ifname: str, dmabuf_fd: int, queues: list[int]) -> netdev.DmabufBinding:
    """Bind the dma-buf to ``queues`` of ``ifname`` (netdev bind-rx); returns the live binding
    (close it to unbind). Errors name the missing capability."""
    with Device.open(ifname) as dev:
        try:
            return netdev.bind_rx(dev, dmabuf_fd, queues)
        except Unsupported as e:
            raise Unsupported(
                f"device {ifname} cannot bind a dma-buf to queue(s) {queues}: it lacks queue "
                "management ops, DMA or header-data split"
                + (f" ({e.extack})" if getattr(e, "extack", "") else ""),
                "devmem TCP needs a NIC with the queue API and tcp-data-split on; elsewhere use "
                "provider 'soft'") from e


def probe_device(ifname: str, queue: int) -> None:
    """Whether ``ifname`` would take a dma-buf binding, without one: the kernel checks the
    device (queue ops, DMA) before it looks at the fd, so EBADF means the device passed.
    Raises Unsupported naming the device's problem; returns when only the dma-buf is missing."""
    try:
        bind_rx(ifname, netdev.NO_FD, [queue]).close()
    except Unsupported:
        raise
    except OSError as e:
        if e.errno != errno.EBADF:
            raise


def _bind(key: tuple[int, str, tuple[int, ...]], ifname: str, qs: tuple[int, ...],
          area_size: int, dmabuf_fd: int | None) -> DevmemBinding:
    if dmabuf_fd is None and not os.path.exists(UDMABUF_DEV):
        probe_device(ifname, qs[0])  # names what the device lacks before udmabuf does
    with contextlib.ExitStack() as undo:
        fd = udmabuf_create(area_size) if dmabuf_fd is None else os.dup(dmabuf_fd)
        undo.callback(os.close, fd)
        size = os.lseek(fd, 0, os.SEEK_END)
        if size < area_size:
            raise UsageError(f"dma-buf fd {dmabuf_fd} holds {size} bytes, area needs "
                             f"{area_size}", "export a larger dma-buf or ask for a smaller area")
        count_fd = os.memfd_create("zcnet-devmem-members", os.MFD_CLOEXEC)
        undo.callback(os.close, count_fd)
        os.ftruncate(count_fd, PAGE)
        try:
            netlink = bind_rx(ifname, fd, list(qs))
        except OSError as e:
            if e.errno != errno.EEXIST:
                raise
            # Not ours (this process's bindings are in the registry): someone else's.
            raise NetlinkError(
                errno.EEXIST, f"queue{'s' if len(qs) > 1 else ''} {queue_list(qs)} of "
                f"{ifname} is bound by another program (zcrx or devmem) or an XDP program",
                getattr(e, "extack", ""),
                hint="stop that program, or receive on other queues (zcnet nic setup "
                     "--queues)") from e
        undo.callback(netlink.close)
        b = DevmemBinding(ifname=ifname, queues=qs, dmabuf_fd=fd, size=size,
                          reserve=_reserve(ifname), binding_id=netlink.id, count_fd=count_fd,
                          netlink=netlink, key=key)
        undo.pop_all()
    return b


def _reserve(ifname: str) -> int:
    """Bytes of the dma-buf the device keeps ahead: its RX ring in pages (0 when the device
    does not say)."""
    try:
        with Device.open(ifname) as dev:
            rx = ethtool.rings_get(dev).get("rx", 0)
    except (OSError, ZcnetError):
        return 0
    return int(rx) * PAGE if isinstance(rx, int) else 0
