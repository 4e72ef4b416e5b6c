"""What a receiver should say about the device it registered on (``Receiver.why``, JSON).

Some devices accept zero-copy registration without receiving by DMA: netdevsim (with zcnet's
test kernel patch) forwards the sender's pages to its peer, so every byte reaches the
registered memory through the kernel's copy fallback. Such results prove registration and the
user-visible protocol, never the DMA; this module names that wherever a receiver reports.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

from zcnet.uapi import ethtool as e

# Drivers whose "zero-copy" receive is a kernel copy, and what to say about it.
COPYING_DRIVERS = {
    "netdevsim": "netdevsim forwards the sender's pages, so the kernel copies every byte "
                 "(registration and protocol are real, the DMA is not)",
}
_IFREQ = struct.Struct("=16sQ16x")  # ifr_name, then ifr_data: 40 bytes


def driver_name(ifname: str) -> str | None:
    """The driver of IFNAME in this thread's namespace (ETHTOOL_GDRVINFO), None if unknown."""
    if not ifname or len(ifname.encode()) >= e.IFNAMSIZ:
        return None
    info = e.ethtool_drvinfo(cmd=e.ETHTOOL_GDRVINFO)
    ifr = bytearray(_IFREQ.pack(ifname.encode(), ctypes.addressof(info)))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            fcntl.ioctl(sock.fileno(), e.SIOCETHTOOL, ifr, True)
    except OSError:
        return None
    return info.driver.decode(errors="replace") or None


def copy_note(ifname: str | None) -> str | None:
    """Why data on IFNAME is copied by the kernel despite zero-copy registration, or None."""
    driver = driver_name(ifname) if ifname else None
    return COPYING_DRIVERS.get(driver or "")
