"""Snapshots of what a test may leak: namespaces, veth links, child processes, fds, mappings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _foreign(ns: str) -> bool:
    """A lab namespace owned by a live process that is neither us nor our descendant.

    Other test runs (or a developer's ``zcnet bench``) may run at the same time; their labs are
    not our leak. A lab whose owner died is always counted: nobody else will remove it.
    """
    from zcnet.lab.names import parse_netns, pid_alive

    lab = parse_netns(ns)
    if lab is None or lab.owner is None or not pid_alive(lab.owner):
        return False
    pid, me = lab.owner, os.getpid()
    while pid > 1:
        if pid == me:
            return False
        pid = _ppid(pid)
    return True


def _netns() -> frozenset[str]:
    d = Path("/run/netns")
    names = (p.name for p in d.iterdir()) if d.is_dir() else ()
    return frozenset(n for n in names if not _foreign(n))


def _veths() -> frozenset[str]:
    out = set()
    for dev in Path("/sys/class/net").iterdir():
        try:
            kind = (dev / "uevent").read_text()
        except OSError:
            continue
        # veth has no 'DEVTYPE' line; its driver link names it.
        drv = dev / "device" / "driver"
        if "DEVTYPE" not in kind and not drv.exists() and (dev / "iflink").exists():
            iflink = (dev / "iflink").read_text().strip()
            ifindex = (dev / "ifindex").read_text().strip()
            if iflink != ifindex and dev.name != "lo":
                out.add(dev.name)
    return frozenset(out)


def _children() -> frozenset[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            pids.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return frozenset(pids)


def _fds() -> frozenset[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            continue
    return frozenset(out)


def _uring_maps() -> int:
    return sum("io_uring" in line for line in Path("/proc/self/maps").read_text().splitlines())


@dataclass(frozen=True)
class Snapshot:
    netns: frozenset[str]
    veths: frozenset[str]
    children: frozenset[int]
    fds: frozenset[str]
    uring_maps: int

    @classmethod
    def take(cls) -> Snapshot:
        return cls(_netns(), _veths(), _children(), _fds(), _uring_maps())

    def leaked_since(self, before: Snapshot) -> list[str]:
        problems = []
        if extra := self.netns - before.netns:
            problems.append(f"network namespaces left: {sorted(extra)}")
        if extra := self.veths - before.veths:
            problems.append(f"veth links left: {sorted(extra)}")
        if extra := self.children - before.children:
            problems.append(f"child processes left: {sorted(extra)}")
        if extra := self.fds - before.fds:
            problems.append(f"file descriptors left: {sorted(extra)}")
        if self.uring_maps > before.uring_maps:
            problems.append(f"io_uring mappings left: {self.uring_maps - before.uring_maps}")
        return problems
