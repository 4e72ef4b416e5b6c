"""Namespace and link primitives that a ``Lab`` and the sweeper share: create and remove a named
namespace, delete a veth, the two per-interface details of bringing a side up (DAD off,
operstate), and the per-queue CPU masks (RPS, XPS) that steer a device's traffic. Each takes
names, not a Lab, so the sweeper can apply them to a dead process's lab.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from pyroute2 import netns as pr_netns
from pyroute2.netlink.exceptions import NetlinkError

from zcnet.errors import ZcnetError
from zcnet.lab.rtnl import rtnl, translate
from zcnet.netns import NoSuchNetns, in_netns, netns_exists, netns_path, netns_popen

log = logging.getLogger(__name__)


def remove_netns(ns: str) -> bool:
    """Unmount and unlink /run/netns/NS; False if it was already gone."""
    try:
        pr_netns.remove(ns)
    except FileNotFoundError:
        return False
    return True


def create_netns(ns: str) -> bool:
    """Create and bind /run/netns/NS; False if the name is taken."""
    # Checked first because pyroute2 does not reap its helper process when creation fails;
    # only two processes racing for one name (two `lab up` at once) still get there.
    if os.path.lexists(netns_path(ns)):
        return False
    try:
        pr_netns.create(ns)
    except FileExistsError:
        return False
    except OSError as exc:
        raise translate(exc, f"creating namespace {ns}") from exc
    except RuntimeError as exc:  # pyroute2's helper process died before answering
        raise ZcnetError(f"creating namespace {ns} failed: {exc}") from exc
    return True


def delete_veth(ns: str, ifname: str) -> None:
    """Delete the veth end IFNAME in NS (and so its peer); quiet if either is already gone."""
    if not netns_exists(ns):
        return
    try:
        with rtnl(ns) as ipr:
            found = ipr.link_lookup(ifname=ifname)
            if found:
                ipr.link("del", index=found[0])
    except NoSuchNetns:
        return  # removed meanwhile (a concurrent sweeper, or our own signal handler)
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:  # deleted meanwhile, e.g. via its peer
            raise


class LinkAttrs(Protocol):
    """A link message of pyroute2 (``ipr.link("get", ...)``): its attributes by name."""

    def get(self, key: str) -> object: ...


def is_up(msg: LinkAttrs) -> bool:
    """Operstate UP; netdevsim reports UNKNOWN (no link mode) with carrier once linked."""
    state = msg.get("IFLA_OPERSTATE")
    return state == "UP" or (state == "UNKNOWN" and msg.get("IFLA_CARRIER") == 1)


def disable_dad(ns: str, ifname: str) -> None:
    """accept_dad=0 so the link-local address is usable at once too. /proc/sys/net shows the
    namespace of the thread that opens it, hence in_netns."""
    with in_netns(ns):
        try:
            Path(f"/proc/sys/net/ipv6/conf/{ifname}/accept_dad").write_text("0\n")
        except OSError as exc:
            log.debug("accept_dad on %s: %s", ifname, exc)


def cpu_mask(cpus: Iterable[int]) -> str:
    """CPUs as the kernel's bitmap text for a sysfs mask file: hex with a comma every 32 bits
    (it refuses a longer run of digits with EOVERFLOW); no CPU is "0"."""
    digits = f"{sum(1 << c for c in set(cpus)):x}"
    return ",".join(reversed([digits[max(0, i - 8):i] for i in range(len(digits), 0, -8)]))


def write_queue_files(ns: str, ifname: str, writes: Sequence[tuple[str, str, str]], what: str,
                      fix: str) -> None:
    """Write sysfs files of IFNAME's queues in namespace NS, each ``(queue glob, file, value)``
    in order, e.g. ``("rx-*", "rps_cpus", "1")``; a ZcnetError naming ``what`` and ``fix`` if
    one fails. /sys/class/net shows a namespace's devices only through a sysfs mounted inside
    it, which ``ip netns exec`` provides."""
    script = ('cd /sys/class/net/"$1"/queues || exit 1; shift; while [ $# -gt 0 ]; do '
              'for q in $1; do printf %s "$3" > "$q/$2" || exit 1; done; shift 3; done')
    argv = ["sh", "-c", script, "sh", ifname, *(x for w in writes for x in w)]
    proc = netns_popen(ns, argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=30)
    if proc.returncode:
        raise ZcnetError(f"{what}: {err.strip() or f'exit status {proc.returncode}'}", fix)
