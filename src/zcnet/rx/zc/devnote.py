"""What a receiver should say about the device it registered on (``Receiver.why``, JSON).

Some devices accept zero-copy registration without a NIC's DMA behind it. netdevsim comes in
two kinds, told apart by the firmware version its ethtool driver info reports:

- zcnet's test kernel (fw_version ``zcnet-dma-sim``): the driver writes the payload into the
  registered memory through the DMA address the page pool assigned, a CPU copy standing in
  for a NIC's DMA engine. The kernel's zero-copy path runs for real (its copy counters say
  how much it copied); a NIC's DMA and its speed are not shown.
- upstream netdevsim: it forwards the sender's pages to its peer, so every byte reaches the
  registered memory through the kernel's copy fallback: registration and the user-visible
  protocol are real, zero copy is not.

This module names that wherever a receiver reports.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

from zcnet.netns import in_netns
from zcnet.uapi import ethtool as e

SIMULATED_DMA = "zcnet-dma-sim"  # ethtool fw_version of zcnet's patched netdevsim
NETDEVSIM_DMA_NOTE = ("netdevsim (zcnet's test kernel) writes the payload into the registered "
                      "memory through its DMA address, a CPU copy standing in for a NIC's DMA: "
                      "the kernel's zero-copy path is real, a NIC's DMA and speed are not")
NETDEVSIM_FORWARD_NOTE = ("netdevsim forwards the sender's pages, so the kernel copies every "
                          "byte (registration and protocol are real, the DMA is not)")
_IFREQ = struct.Struct("=16sQ16x")  # ifr_name, then ifr_data: 40 bytes


def driver_info(ifname: str) -> tuple[str, str] | None:
    """(driver, firmware version) of IFNAME in this thread's namespace (ETHTOOL_GDRVINFO),
    None if unknown."""
    if not ifname or len(ifname.encode()) >= e.IFNAMSIZ:
        return None
    info = e.ethtool_drvinfo(cmd=e.ETHTOOL_GDRVINFO)
    ifr = bytearray(_IFREQ.pack(ifname.encode(), ctypes.addressof(info)))
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            fcntl.ioctl(sock.fileno(), e.SIOCETHTOOL, ifr, True)
    except OSError:
        return None
    return info.driver.decode(errors="replace"), info.fw_version.decode(errors="replace")


def device_note(ifname: str | None, netns: str | None = None) -> str | None:
    """What to say about receiving on IFNAME (in NETNS, else this thread's namespace) because
    no NIC's DMA fills the memory there, or None for any other device."""
    if not ifname:
        return None
    if netns is None:
        info = driver_info(ifname)
    else:
        with in_netns(netns):
            info = driver_info(ifname)
    if info is None or info[0] != "netdevsim":
        return None
    return NETDEVSIM_DMA_NOTE if info[1] == SIMULATED_DMA else NETDEVSIM_FORWARD_NOTE
