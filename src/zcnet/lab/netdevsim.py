"""netdevsim ports for labs: simulated NICs with queues, ethtool rings, page pools and NAPIs.

Some facts about netdevsim (drivers/net/netdevsim, bus.c) that shape this module:

- Devices are made and removed by writing to ``/sys/bus/netdevsim/new_device`` ("ID PORTS
  QUEUES") and ``del_device`` ("ID"). The port's netdev appears in the network namespace of the
  writing thread, so a write from inside a lab namespace puts the port straight there.
- Two ports are joined by writing "NETNSFD_A:IFINDEX_A NETNSFD_B:IFINDEX_B" to ``link_device``
  (the fds are this process's); a linked port transmits into its peer's RX queue numbered like
  the TX queue the packet left on (so XPS on the sender steers a flow to a receive queue).
- A bus device is not tied to a namespace: when its namespace goes away the port moves to the
  initial namespace and the device stays. So every device is deleted explicitly, and device IDs
  encode the lab that owns them (``device_id``), so a device left by a killed run is found and
  deleted by the sweeper (``zcnet lab down``) without any state file.
- Upstream netdevsim has no ntuple filters and no RSS (no ``get_rxfh``/``get_rxnfc``); it has
  channels, tcp-data-split and hds-thresh and page-pool stats. zcnet's test kernel patch adds
  queues that take a zcrx or devmem memory provider and receive into it by (simulated) DMA,
  ntuple rules and RSS that pick the RX queue (else the TX queue's number, as upstream), and
  per-queue RX counters (docs/netdevsim.md).
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from zcnet.errors import ZcnetError
from zcnet.lab.names import SIDES, LabName, pid_alive
from zcnet.lab.plumbing import cpu_mask, write_queue_files
from zcnet.netns import in_netns, netns_path

SYSFS = Path("/sys/bus/netdevsim")
DEFAULT_QUEUES = 4
# Device IDs of zcnet labs: bit 30 set, then owner pid (22 bits; 0 for persistent labs), the
# lab's counter modulo 128 (7 bits) and the side (1 bit).
_MARK = 1 << 30
_PID_MAX = (1 << 22) - 1
_DEVICE_DIR = re.compile(r"netdevsim(?P<id>\d+)")


class NoNetdevsim(ZcnetError):
    def __init__(self) -> None:
        super().__init__(f"this kernel has no netdevsim ({SYSFS} is missing)",
                         "boot zcnet's test kernel: `zcnet vm run --kernel nsim -- CMD`, "
                         "or `modprobe netdevsim` where it is a module")


@dataclass(frozen=True)
class Owner:
    pid: int | None    # None: a persistent lab
    counter: int       # the lab's counter modulo 128
    side: str


def _counter(lab: LabName) -> int:
    m = re.search(r"(\d+)$", lab.name)
    return int(m.group(1)) if m else 0


def device_id(lab: LabName, side: str) -> int:
    pid = lab.owner or 0
    if pid > _PID_MAX:
        raise ZcnetError(f"pid {pid} too large for a netdevsim lab device ID")
    return _MARK | pid << 8 | (_counter(lab) & 0x7F) << 1 | SIDES.index(side)


def owner_of(dev_id: int) -> Owner | None:
    """Who a device ID belongs to; None for devices zcnet did not make."""
    if not dev_id & _MARK or dev_id >= _MARK << 1:
        return None
    pid = dev_id >> 8 & _PID_MAX
    return Owner(pid or None, dev_id >> 1 & 0x7F, SIDES[dev_id & 1])


def available() -> bool:
    return (SYSFS / "new_device").exists()


def require() -> None:
    if not available():
        raise NoNetdevsim


def device_ids() -> list[int]:
    """IDs of the netdevsim devices present."""
    devices = SYSFS / "devices"
    if not devices.is_dir():
        return []
    return sorted(int(m["id"]) for p in devices.iterdir()
                  if (m := _DEVICE_DIR.fullmatch(p.name)))


def _write(name: str, text: str) -> None:
    with open(SYSFS / name, "w") as fh:
        fh.write(text)


def create(ns: str, dev_id: int, queues: int) -> None:
    """A one-port device DEV_ID whose port appears in namespace NS with QUEUES queues."""
    require()
    try:
        with in_netns(ns):
            _write("new_device", f"{dev_id} 1 {queues}")
    except OSError as exc:
        hint = ("a device with this ID exists: `zcnet lab down` removes stale ones"
                if exc.errno in (errno.EEXIST, errno.ENOSPC, errno.EBUSY) else None)
        raise ZcnetError(f"creating netdevsim device {dev_id} in {ns}: {exc.strerror}",
                         hint) from exc


def link(ns_a: str, ifindex_a: int, ns_b: str, ifindex_b: int) -> None:
    """Join two ports so that each transmits into the other."""
    fd_a = os.open(netns_path(ns_a), os.O_RDONLY | os.O_CLOEXEC)
    try:
        fd_b = os.open(netns_path(ns_b), os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write("link_device", f"{fd_a}:{ifindex_a} {fd_b}:{ifindex_b}")
        except OSError as exc:
            raise ZcnetError(f"linking netdevsim ports {ifindex_a} ({ns_a}) and "
                             f"{ifindex_b} ({ns_b}): {exc.strerror}") from exc
        finally:
            os.close(fd_b)
    finally:
        os.close(fd_a)


def delete(dev_id: int) -> bool:
    """Delete device DEV_ID; False if it was already gone."""
    if not (SYSFS / "devices" / f"netdevsim{dev_id}").exists():
        return False
    try:
        _write("del_device", str(dev_id))
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
            return False
        raise ZcnetError(f"deleting netdevsim device {dev_id}: {exc.strerror}") from exc
    return True


def delete_lab_devices(lab: LabName) -> list[int]:
    """Delete both devices of LAB (whichever exist); returns the IDs deleted."""
    return [i for i in (device_id(lab, side) for side in SIDES) if delete(i)]


def sweep_orphans(live_persistent: set[int]) -> list[int]:
    """Delete zcnet devices whose owner process is gone, or (persistent labs) whose lab is not
    among LIVE_PERSISTENT (their counters modulo 128). Returns the IDs deleted."""
    swept = []
    for dev_id in device_ids():
        owner = owner_of(dev_id)
        if owner is None:
            continue
        dead = (owner.counter not in live_persistent if owner.pid is None
                else not pid_alive(owner.pid))
        if dead and delete(dev_id):
            swept.append(dev_id)
    return swept


def steer_tx(ns: str, ifname: str, queue: int) -> None:
    """Make every CPU transmit on IFNAME's TX queue QUEUE (XPS), so its linked peer receives
    all of it on RX queue QUEUE."""
    every_cpu = cpu_mask(range(os.cpu_count() or 1))
    write_queue_files(ns, ifname, [("tx-*", "xps_cpus", "0"),
                                   (f"tx-{queue}", "xps_cpus", every_cpu)],
                      f"steering {ifname} ({ns}) to TX queue {queue} with XPS failed",
                      "is the kernel built with XPS?")
