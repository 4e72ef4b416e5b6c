"""devmem TX: TCP sends whose payload the device reads from a dma-buf (kperf's devmem TX).

Some facts about devmem TX (Documentation/networking/devmem.rst; net/ipv4/tcp.c
``tcp_sendmsg_locked``, net/core/devmem.c, net/core/datagram.c, net/core/sock.c):

- bind-tx (netdev netlink: ifindex and dma-buf fd, ``zcnet.nic.netdev.bind_tx``) maps the dma-buf
  for the device's TX and answers a binding id; the binding lives while the netlink socket that
  asked is open. A driver without netmem TX refuses before it looks at the fd ("Driver does not
  support netmem TX", EOPNOTSUPP): veth and loopback do.
- One send is sendmsg(MSG_ZEROCOPY) on a socket with SO_ZEROCOPY, carrying one SCM_DEVMEM_DMABUF
  control message (SOL_SOCKET, the binding id as a u32, cmsg_len exactly CMSG_LEN(4) or
  EINVAL). Each iovec's base is an offset into the dma-buf, not an address, which Python's
  ``socket.sendmsg`` cannot express: the message goes through libc's sendmsg, built once.
- Binding id 0 means "no dma-buf" to the kernel (ids start at 1): the iovecs would be read as
  addresses of this process. Id 0 is never sent.
- EINVAL, with nothing queued and no zero-copy id taken: the id names no TX binding (closed,
  never made, or made by bind-rx), or MSG_ZEROCOPY / SO_ZEROCOPY is missing, or the route's
  device lacks scatter-gather.
- The route must leave through the bound device, ENODEV otherwise (the dma addresses are that
  device's). So the sender binds the socket to it (SO_BINDTODEVICE) and leaves it bound at
  close: retransmissions of bytes still in flight must leave the same way.
- Past the dma-buf's end the kernel drops the segment that reaches it (EFAULT when that is the
  call's first) but keeps the segments it filled before: a range running past the end is sent in
  part and the call returns the short count (seen in the netdevsim VM). Ranges are checked here,
  before the call, so a bad range sends nothing.
- Completions are MSG_ZEROCOPY's (error-queue id ranges, ``zcnet.tx.zerocopy``), so the sender is
  a ``MsgZerocopySender`` whose one send differs: a slot (a range of the dma-buf) is written
  again only after its completion.
- Only TCP reads SCM_DEVMEM_DMABUF: devmem TX does not exist for UDP.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import socket
import struct
from typing import Protocol

from pyroute2 import IPRoute

from zcnet.errors import Unsupported, UsageError, ZcnetError, require_int
from zcnet.nic import netdev
from zcnet.nic.device import Device
from zcnet.tx.msgzc import MsgZerocopySender
from zcnet.tx.slots import SlotHook
from zcnet.uapi.ethtool import IFNAMSIZ
from zcnet.uapi.netdev import NETDEV_CMD_BIND_TX
from zcnet.uapi.socket import (
    MSG_ZEROCOPY,
    SCM_DEVMEM_DMABUF,
    SO_ZEROCOPY,
    SOL_SOCKET,
    cmsghdr,
    iovec,
    user_msghdr,
)
from zcnet.uring.dmabuf import Udmabuf, cpu_write

__all__ = ["DevmemError", "DevmemMsg", "DevmemSender", "DmabufMemory", "devmem_cmsg",
           "egress_ifname", "open_tx_dmabuf", "probe_tx_device"]

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sendmsg = _libc.sendmsg
_sendmsg.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
_sendmsg.restype = ctypes.c_ssize_t

_ID = struct.Struct("=I")
_MAX_ID = (1 << 32) - 1
_NO_FIX = "use a NIC whose driver supports netmem TX, or send with --tx msgzc"


class DmabufMemory(Protocol):
    """What the devmem sender sends from: a dma-buf ``fd`` and a writable CPU ``view`` of its
    first bytes (``zcnet.uring.dmabuf.Udmabuf`` is one)."""

    fd: int
    view: memoryview


class DevmemError(OSError, ZcnetError):
    """The kernel refused a devmem send: ``errno`` as it said, the message names the cause."""

    def __init__(self, err: int, message: str, hint: str) -> None:
        OSError.__init__(self, err, message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return ZcnetError.__str__(self)


def devmem_cmsg(binding_id: int) -> bytes:
    """The SCM_DEVMEM_DMABUF control message naming ``binding_id``: CMSG_SPACE(4) bytes."""
    head = bytes(cmsghdr(cmsg_len=socket.CMSG_LEN(_ID.size), cmsg_level=SOL_SOCKET,
                         cmsg_type=SCM_DEVMEM_DMABUF))
    raw = head + _ID.pack(binding_id)
    return raw + bytes(socket.CMSG_SPACE(_ID.size) - len(raw))


def _bound_device(sock: socket.socket) -> str:
    raw = sock.getsockopt(SOL_SOCKET, socket.SO_BINDTODEVICE, IFNAMSIZ)
    return raw.split(b"\0", 1)[0].decode()


class DevmemMsg:
    """sendmsg(MSG_ZEROCOPY) of ranges of a dma-buf of ``size`` bytes bound for TX as
    ``binding_id`` on ``ifname``: one msghdr, iovec and control message, built once and
    rewritten per send (no allocation per call)."""

    def __init__(self, binding_id: int, size: int, ifname: str = "") -> None:
        require_int("dma-buf binding id", binding_id, "pass the id bind-tx answered")
        if not 0 < binding_id <= _MAX_ID:
            raise UsageError(f"dma-buf binding id {binding_id} is out of range (1..{_MAX_ID})",
                             "pass the id bind-tx answered; 0 would make the kernel read the "
                             "offsets as addresses of this process")
        require_int("dma-buf size", size, "pass the dma-buf's size in bytes")
        self.binding_id = binding_id
        self.size = size
        self.ifname = ifname
        ctrl = devmem_cmsg(binding_id)
        self._ctrl = ctypes.create_string_buffer(ctrl, len(ctrl))  # no NUL added
        self._iov = iovec()
        self._msg = user_msghdr(msg_iov=ctypes.pointer(self._iov), msg_iovlen=1,
                                msg_control=ctypes.addressof(self._ctrl),
                                msg_controllen=len(ctrl))
        self._addr = ctypes.addressof(self._msg)

    def send(self, sock: socket.socket, offset: int, length: int) -> int:
        """Send ``length`` bytes from ``offset`` of the dma-buf; returns what the kernel took
        (short when a send-buffer wait is cut by SO_SNDTIMEO). A range outside the dma-buf is a
        UsageError (nothing sent); the kernel's refusals are DevmemError naming the cause."""
        if offset < 0 or length <= 0 or offset + length > self.size:
            raise UsageError(f"devmem send of {length} B at offset {offset} does not fit the "
                             f"{self.size} B dma-buf",
                             "send ranges inside the dma-buf (0 <= offset, offset + length <= "
                             "size)")
        try:
            return self.sendmsg(sock.fileno(), offset, length)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.ENOBUFS):
                raise  # the socket's buffers are full: the caller waits and retries
            raise self.refusal(sock, exc.errno or errno.EIO) from None

    def sendmsg(self, fd: int, offset: int, length: int, flags: int = MSG_ZEROCOPY) -> int:
        """The bare system call, unchecked (tests use it to show the kernel's own checks);
        OSError as the kernel said."""
        self._iov.iov_base = offset
        self._iov.iov_len = length
        while True:
            n = _sendmsg(fd, self._addr, flags)
            if n >= 0:
                return n
            err = ctypes.get_errno()
            if err != errno.EINTR:  # EINTR: retried, as Python's own socket calls do
                raise OSError(err, os.strerror(err))

    def refusal(self, sock: socket.socket, err: int) -> DevmemError:
        """The error for the kernel's ``err``, its cause asked of the socket (error path only)."""
        where = f" on {self.ifname}" if self.ifname else ""
        what = f"devmem send from dma-buf binding {self.binding_id}{where}"
        if err == errno.EINVAL and not sock.getsockopt(SOL_SOCKET, SO_ZEROCOPY):
            return DevmemError(err, f"{what}: the socket has no SO_ZEROCOPY (EINVAL)",
                               "set SO_ZEROCOPY=1 on it first (the devmem sender does)")
        if err == errno.EINVAL:
            return DevmemError(err, f"{what}: the kernel knows no TX binding "
                               f"{self.binding_id} (EINVAL)",
                               "its netlink socket was closed, or the id is wrong or from "
                               "bind-rx: bind the dma-buf with bind-tx and keep the binding open")
        if err == errno.ENODEV:
            bound = _bound_device(sock)
            why = f"bound to {bound}" if bound else "not bound to a device"
            return DevmemError(err, f"{what}: the socket's route does not leave through the "
                               f"bound device (the socket is {why}) (ENODEV)",
                               "bind the socket to the device (SO_BINDTODEVICE) and reach the "
                               "peer through it")
        if err == errno.EFAULT:
            return DevmemError(err, f"{what}: the kernel found a range outside the dma-buf "
                               "(EFAULT)", "send ranges inside the dma-buf")
        return DevmemError(err, f"{what}: {os.strerror(err)}",
                           "nothing devmem-specific: the connection refused the send (closed or "
                           "reset by the peer?)")


def egress_ifname(sock: socket.socket) -> str:
    """The device ``sock``'s packets leave through: the one it is bound to (SO_BINDTODEVICE),
    else the route to its peer in this network namespace."""
    bound = _bound_device(sock)
    if bound:
        return bound
    peer = sock.getpeername()[0]
    with IPRoute() as ipr:
        routes = ipr.route("get", dst=peer)
    oif = routes[0].get_attr("RTA_OIF") if routes else None
    if not oif:
        raise ZcnetError(f"no route to {peer} names an output device",
                         "bind the socket to a device (SO_BINDTODEVICE) or pass ifname")
    return socket.if_indextoname(oif)


def _bind_tx(ifname: str, dmabuf_fd: int) -> netdev.DmabufBinding:
    """bind-tx of ``dmabuf_fd`` on ``ifname``; the device's refusal as Unsupported in one line
    (the kernel's extack kept)."""
    with Device.open(ifname) as dev:
        if not netdev.has_op(dev, NETDEV_CMD_BIND_TX):
            raise Unsupported(f"this kernel has no devmem TX (no bind-tx in its netdev family), "
                              f"so {ifname} cannot send from a dma-buf",
                              "devmem TX needs Linux 6.16 or newer; send with --tx msgzc")
        try:
            return netdev.bind_tx(dev, dmabuf_fd)
        except Unsupported as e:
            extack = getattr(e, "extack", "")
            raise Unsupported(f"device {ifname} cannot send from a dma-buf"
                              + (f" ({extack})" if extack else ""), _NO_FIX) from e


def probe_tx_device(ifname: str) -> None:
    """Whether ``ifname`` would take a TX binding, without one: the kernel checks the device
    before the fd, so fd -1 failing with EBADF means the device passed. Raises Unsupported
    naming the device's problem."""
    try:
        _bind_tx(ifname, netdev.NO_FD).close()
    except OSError as e:
        if e.errno != errno.EBADF:
            raise


def open_tx_dmabuf(sock: socket.socket, size: int, ifname: str | None = None) -> Udmabuf:
    """A udmabuf of ``size`` bytes to send on ``sock`` by devmem. The socket's device is asked
    first, so a device that cannot send from a dma-buf is the error, not a missing udmabuf."""
    probe_tx_device(ifname or egress_ifname(sock))
    return Udmabuf(size)


def _memory(buf: object) -> tuple[int, memoryview, int]:
    """(fd, view, dma-buf size) of a DmabufMemory; a UsageError naming what is wrong."""
    fd, view = getattr(buf, "fd", None), getattr(buf, "view", None)
    if not isinstance(fd, int) or not isinstance(view, memoryview):
        raise UsageError(f"the devmem sender sends from a dma-buf, not {type(buf).__name__}",
                         "pass zcnet.uring.dmabuf.Udmabuf(size) (or an object with the dma-buf "
                         "as .fd and its CPU mapping as .view)")
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
    except OSError as e:  # EBADF: closed; ESPIPE: a pipe or socket
        raise UsageError(f"dma-buf fd {fd} cannot be used: {e.strerror}",
                         "pass an open dma-buf") from None
    if len(view) > size:
        raise UsageError(f"the view holds {len(view)} B, the dma-buf only {size} B",
                         "pass a view of the dma-buf's own memory")
    return fd, view, size


class DevmemSender(MsgZerocopySender):
    """Sends slots of a dma-buf (``buf``: a :class:`DmabufMemory`) bound for TX to the socket's
    egress device (or ``ifname``). The socket is bound to that device; ``on_fill`` writes run
    inside the dma-buf's CPU write bracket; completions, slot reuse and counters are
    MsgZerocopySender's. ``close()`` flushes, then drops the binding."""

    kind = "devmem"

    def __init__(self, sock: socket.socket, buf: DmabufMemory, slots: int = 8,
                 on_fill: SlotHook | None = None, on_release: SlotHook | None = None, *,
                 ifname: str | None = None) -> None:
        fd, view, size = _memory(buf)
        with contextlib.ExitStack() as undo:
            # Socket and slot checks first, then SO_ZEROCOPY and bounded waits (undone below
            # if the device refuses).
            super().__init__(sock, view, slots,
                             self._synced(fd, on_fill) if on_fill else None, on_release)
            undo.callback(self._bounded.restore)
            # A refused sender must not pin the caller's memory (its traceback holds it).
            undo.callback(self._drop_views)
            dev = ifname or egress_ifname(sock)
            bound = _bound_device(sock)
            if bound and bound != dev:
                raise UsageError(f"the socket is bound to {bound}, the dma-buf would be bound "
                                 f"to {dev}", "bind the socket to the sending device")
            self.binding = _bind_tx(dev, fd)
            undo.callback(self.binding.close)
            if not bound:
                sock.setsockopt(SOL_SOCKET, socket.SO_BINDTODEVICE, dev.encode())
            self.ifname = dev
            self._msg = DevmemMsg(self.binding.id, size, dev)
            undo.pop_all()

    def _drop_views(self) -> None:
        for v in (*self.slots, self.view):
            v.release()

    @staticmethod
    def _synced(fd: int, on_fill: SlotHook) -> SlotHook:
        def fill(slot: int, view: memoryview) -> None:
            with cpu_write(fd):
                on_fill(slot, view)
        return fill

    def _send_part(self, slot: int, start: int, end: int) -> int:
        return self._msg.send(self.sock, slot * self.slot_size + start, end - start)

    def close(self) -> None:
        """Flush (bounded, errors suppressed), then unbind the dma-buf; idempotent. Sends the
        kernel still holds keep the binding alive there until they complete."""
        if self._closed:
            return
        try:
            super().close()
        finally:
            self.binding.close()
