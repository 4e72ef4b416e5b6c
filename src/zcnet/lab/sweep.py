"""Finding the labs on this machine, describing them, and removing them (stale ones first of all).

A lab's namespaces are found by name under /run/netns (see ``zcnet.lab.names``); its owner pid is
in the name, so a lab whose owner died (``kill -9``, a crash, a power cut of the process) is
recognised and removed by ``sweep_stale`` without any state file.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field

from pyroute2.netlink.exceptions import NetlinkError

from zcnet.errors import UsageError, ZcnetError
from zcnet.lab import names, netdevsim
from zcnet.lab.plumbing import delete_veth, remove_netns
from zcnet.lab.rtnl import rtnl, translate
from zcnet.netns import NeedRoot, list_netns, netns_exists

log = logging.getLogger(__name__)

# AF_INET, AF_INET6 (linux/socket.h)
_FAMILY = (2, 10)


@dataclass(frozen=True)
class Link:
    ns: str
    ifname: str
    mtu: int
    state: str
    addrs: tuple[str, ...]


@dataclass
class LabInfo:
    name: str
    owner: int | None  # None: persistent (`zcnet lab up`)
    alive: bool  # owner running, or persistent
    namespaces: list[str] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    problem: str = ""  # why links could not be read

    @property
    def stale(self) -> bool:
        return not self.alive

    @property
    def mtu(self) -> int | None:
        mtus = {link.mtu for link in self.links}
        return mtus.pop() if len(mtus) == 1 else None


def find_labs() -> dict[str, LabInfo]:
    """zcnet labs present under /run/netns, by lab name (half-removed labs included)."""
    labs: dict[str, LabInfo] = {}
    for ns in list_netns():
        lab = names.parse_netns(ns)
        if lab is None:
            continue
        info = labs.get(lab.name)
        if info is None:
            alive = lab.owner is None or names.pid_alive(lab.owner)
            info = labs[lab.name] = LabInfo(lab.name, lab.owner, alive)
        info.namespaces.append(ns)
    return labs


def _links(ns: str) -> list[Link]:
    out = []
    with rtnl(ns) as ipr:
        addrs: dict[int, list[str]] = {}
        for msg in ipr.get_addr():
            # global scope only: the fe80:: link-locals say nothing about the lab
            if msg["family"] in _FAMILY and msg["scope"] == 0:
                addrs.setdefault(msg["index"], []).append(
                    f"{msg.get('IFA_ADDRESS')}/{msg['prefixlen']}")
        for msg in ipr.get_links():
            ifname = msg.get("IFLA_IFNAME")
            if ifname == "lo":
                continue
            out.append(Link(ns, ifname, int(msg.get("IFLA_MTU")),
                            str(msg.get("IFLA_OPERSTATE")), tuple(addrs.get(msg["index"], []))))
    return out


def describe(info: LabInfo) -> LabInfo:
    """Fill in the interfaces of INFO's namespaces (needs the rights to enter them)."""
    info.links = []
    for ns in info.namespaces:
        if not netns_exists(ns):
            info.problem = f"{ns} is an unmounted leftover"
            continue
        try:
            info.links.extend(_links(ns))
        except ZcnetError as exc:
            info.problem = "details need root" if isinstance(exc, NeedRoot) else exc.message
        except (OSError, NetlinkError) as exc:
            info.problem = str(translate(exc, f"reading {ns}"))
    return info


def lab_status() -> list[LabInfo]:
    return [describe(info) for _, info in sorted(find_labs().items())]


def remove_lab(info: LabInfo) -> None:
    """Delete the veth and both namespaces of INFO; whatever is already gone is skipped."""
    lab = names.LabName(info.name, info.owner)
    netdevsim.delete_lab_devices(lab)
    try:
        for ns in lab.namespaces:
            delete_veth(ns, ns)  # each end is named as its namespace
    except NetlinkError as exc:
        if exc.code != errno.ENOENT:
            raise translate(exc, f"removing lab {info.name}") from exc
    for ns in lab.namespaces:
        try:
            remove_netns(ns)
        except PermissionError as exc:
            raise translate(exc, f"removing namespace {ns}") from exc


def sweep_stale() -> list[str]:
    """Remove every lab whose owner process is gone, and netdevsim devices of labs that are
    gone; returns their names."""
    swept = []
    for name, info in sorted(find_labs().items()):
        if info.stale:
            remove_lab(info)
            swept.append(name)
    live = {int(n) % 128 for name, info in find_labs().items()
            if info.owner is None and (n := name.removeprefix("zcup")).isdigit()}
    swept += [f"netdevsim{i}" for i in netdevsim.sweep_orphans(live)]
    return swept


def before_run() -> tuple[list[str], list[LabInfo]]:
    """Before a measurement in a lab: remove every stale lab (its owner is gone) and announce,
    as log warnings, the labs of other running processes and persistent ones, whose traffic
    shares this machine and may disturb the figures. Returns (removed names, others).

    A stale lab that cannot be removed is a warning too: it costs nothing but a namespace.
    """
    removed: list[str] = []
    others: list[LabInfo] = []
    for name, info in sorted(find_labs().items()):
        if info.stale:
            try:
                remove_lab(info)
            except (OSError, NetlinkError, ZcnetError) as exc:
                log.warning("stale lab %s (its process %s is gone) could not be removed: %s",
                            name, info.owner, exc)
                continue
            log.info("removed stale lab %s (its process %s is gone)", name, info.owner)
            removed.append(name)
        elif info.owner != os.getpid():
            others.append(info)
            whose = (f"persistent (`zcnet lab down {name}` removes it)"
                     if info.owner is None else f"of running process {info.owner}")
            log.warning("another lab is up: %s, %s; its traffic shares this machine's CPUs "
                        "and may disturb the measurement", name, whose)
    return removed, others


def lookup(name: str) -> LabInfo:
    """The lab called NAME (or owning namespace NAME); a UsageError if there is none."""
    lab = names.parse_lab(name) or names.parse_netns(name)
    labs = find_labs()
    if lab is None or lab.name not in labs:
        known = ", ".join(sorted(labs)) or "none"
        raise UsageError(f"no zcnet lab named {name!r} (labs: {known})",
                         "`zcnet lab status` lists the labs")
    return labs[lab.name]


def take_down(name: str, *, force: bool = False) -> LabInfo:
    """Remove lab NAME; one whose owner still runs only with FORCE (it would break that run)."""
    info = lookup(name)
    if info.owner is not None and info.alive and not force:
        raise ZcnetError(f"lab {info.name} belongs to running process {info.owner}",
                         "stop that process, or pass --force")
    remove_lab(info)
    return info
