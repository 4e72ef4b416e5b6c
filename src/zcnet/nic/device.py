"""One network interface as the control plane sees it: a generic netlink socket and an ioctl
socket opened in the interface's namespace, its ifindex and driver, and the one place where
kernel errors become messages a user can act on."""

from __future__ import annotations

import ctypes
import errno as errno_mod
import fcntl
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from typing import NoReturn

from zcnet.errors import ClosedError, Unsupported, UsageError, ZcnetError, cap_hint
from zcnet.netns import in_netns
from zcnet.nic.genl import GenlSocket, NetlinkError
from zcnet.nic.ifname import ifname_problem
from zcnet.nic.nlattr import AttrSet, NlAttrs, NlRequest
from zcnet.uapi import ethtool as e

_IFREQ = struct.Struct("=16sQ16x")  # ifr_name, then the union (ifr_data / ifr_ifindex), 40 bytes


class DeviceUnsupported(Unsupported):
    """The driver refused a setting (EOPNOTSUPP or similar); keeps errno and the extack."""

    def __init__(self, driver: str, setting: str, err: int, extack: str = "") -> None:
        msg = f"driver {driver} does not support {setting}"
        if extack:
            msg += f" ({extack})"
        super().__init__(msg, "use a NIC and driver with this feature, or skip this step")
        self.driver = driver
        self.setting = setting
        self.errno = err
        self.extack = extack


# errno -> (message template, hint) for errors that mean the same whatever was asked.
_NEED_NET_ADMIN = cap_hint("CAP_NET_ADMIN")
_ERRNO_TEXT: dict[int, tuple[str, str]] = {
    errno_mod.EPERM: ("{what}: permission denied", _NEED_NET_ADMIN),
    errno_mod.EACCES: ("{what}: permission denied", _NEED_NET_ADMIN),
    errno_mod.ENODEV: ("{what}: interface {ifname} is gone", "check 'ip link'"),
}
_UNSUPPORTED = {errno_mod.EOPNOTSUPP, errno_mod.ENOTSUP}


@dataclass(frozen=True)
class DrvInfo:
    driver: str
    version: str
    firmware: str
    bus_info: str
    n_priv_flags: int


class Device:
    """Open with ``Device.open(ifname, netns)`` as a context manager."""

    def __init__(self, ifname: str, netns: str | None = None, timeout: float = 5.0) -> None:
        self.ifname = ifname
        self.netns = netns
        self._drvinfo: DrvInfo | None = None
        with ExitStack() as undo:
            self.genl = GenlSocket(netns, timeout)
            undo.callback(self.genl.close)
            with in_netns(netns):
                self.ioctl_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM
                                                | socket.SOCK_CLOEXEC)
            undo.callback(self.ioctl_sock.close)
            self.ifindex = self._ifindex()
            undo.pop_all()

    @classmethod
    @contextmanager
    def open(cls, ifname: str, netns: str | None = None,
             timeout: float = 5.0) -> Iterator[Device]:
        with closing(cls(ifname, netns, timeout)) as dev:
            yield dev

    def close(self) -> None:
        """Release both sockets; idempotent. Afterwards every request raises ClosedError."""
        self.ioctl_sock.close()
        self.genl.close()

    def _check_open(self, method: str) -> None:
        if self.ioctl_sock.fileno() < 0:
            raise ClosedError.of(self, method)

    @property
    def where(self) -> str:
        return f"{self.ifname} (netns {self.netns})" if self.netns else self.ifname

    # -------------------------------------------------------------------- ioctl

    def ifreq_ioctl(self, request: int, data: ctypes.Structure) -> None:
        """SIOCETHTOOL-style ioctl: ``data`` is the struct the kernel reads and writes."""
        self._check_open("ifreq_ioctl")
        ifr = bytearray(_IFREQ.pack(os.fsencode(self.ifname), ctypes.addressof(data)))
        fcntl.ioctl(self.ioctl_sock.fileno(), request, ifr, True)

    def _ifindex(self) -> int:
        if (why := ifname_problem(self.ifname)) is not None:
            raise UsageError(f"interface name {self.ifname!r} {why}",
                             "give a name from 'ip link'")
        ifr = bytearray(_IFREQ.pack(os.fsencode(self.ifname), 0))
        try:
            fcntl.ioctl(self.ioctl_sock.fileno(), e.SIOCGIFINDEX, ifr, True)
        except OSError as exc:
            if exc.errno == errno_mod.ENODEV:
                where = f" in network namespace {self.netns}" if self.netns else ""
                raise ZcnetError(f"no network interface named {self.ifname!r}{where}",
                                 "list interfaces with 'ip link'") from None
            raise
        return struct.unpack_from("=i", ifr, 16)[0]

    def flags(self) -> int:
        """SIOCGIFFLAGS: the interface's IFF_* flags."""
        self._check_open("flags")
        ifr = bytearray(_IFREQ.pack(self.ifname.encode(), 0))
        fcntl.ioctl(self.ioctl_sock.fileno(), e.SIOCGIFFLAGS, ifr, True)
        return int(struct.unpack_from("=H", ifr, 16)[0])  # ifr_flags: a short

    def drvinfo(self) -> DrvInfo:
        """ETHTOOL_GDRVINFO: driver and firmware names (netlink has no message for these).

        The loopback device has no ethtool driver info nor a parent device to name one (the
        kernel's fallback): it is named "loopback", after drivers/net/loopback.c, from its
        IFF_LOOPBACK flag."""
        self._check_open("drvinfo")
        if self._drvinfo is None:
            info = e.ethtool_drvinfo(cmd=e.ETHTOOL_GDRVINFO)
            try:
                self.ifreq_ioctl(e.SIOCETHTOOL, info)
            except OSError as exc:
                if exc.errno in _UNSUPPORTED and self.flags() & e.IFF_LOOPBACK:
                    self._drvinfo = DrvInfo("loopback", "", "", "", 0)
                    return self._drvinfo
                raise NetlinkError(exc.errno or errno_mod.EIO,
                                   f"driver info of {self.where}") from None
            self._drvinfo = DrvInfo(
                driver=info.driver.decode(errors="replace"),
                version=info.version.decode(errors="replace"),
                firmware=info.fw_version.decode(errors="replace"),
                bus_info=info.bus_info.decode(errors="replace"),
                n_priv_flags=info.n_priv_flags,
            )
        return self._drvinfo

    @property
    def driver(self) -> str:
        try:
            return self.drvinfo().driver or "?"
        except OSError:
            return "?"

    # -------------------------------------------------------------------- errors

    def raise_unsupported(self, setting: str, what: str, err: int = errno_mod.EOPNOTSUPP,
                          extack: str = "") -> NoReturn:
        raise DeviceUnsupported(self.driver, setting, err, extack)

    def translate(self, exc: OSError, what: str, setting: str | None) -> NoReturn:
        """Turn a kernel refusal into the error a user reads; errno is kept on the result."""
        err = exc.errno or errno_mod.EIO
        extack = getattr(exc, "extack", "")
        if err in _UNSUPPORTED and setting:
            raise DeviceUnsupported(self.driver, setting, err, extack) from exc
        known = _ERRNO_TEXT.get(err)
        if known is not None:
            raise NetlinkError(err, known[0].format(what=what, ifname=self.where), extack,
                               hint=known[1]) from exc
        if isinstance(exc, NetlinkError):
            raise NetlinkError(err, f"{self.where}: {exc.what}", extack) from exc
        raise NetlinkError(err, f"{self.where}: {what}") from exc

    # -------------------------------------------------------------------- netlink

    def genl_do(self, family: str, cmd: int, request: AttrSet, attrs: NlRequest,
                reply: AttrSet | None = None, what: str = "", setting: str | None = None
                ) -> NlAttrs | None:
        self._check_open("genl_do")
        try:
            return self.genl.do(family, cmd, request, attrs, reply, what)
        except NetlinkError as exc:
            self.translate(exc, what, setting)

    def genl_dump(self, family: str, cmd: int, request: AttrSet, attrs: NlRequest,
                  reply: AttrSet | None = None, what: str = "", setting: str | None = None
                  ) -> list[NlAttrs]:
        self._check_open("genl_dump")
        try:
            return self.genl.dump(family, cmd, request, attrs, reply, what)
        except NetlinkError as exc:
            self.translate(exc, what, setting)
