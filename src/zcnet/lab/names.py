"""How labs are named, and what a name says about its owner.

A lab ``L`` is two namespaces ``La`` and ``Lb``; the veth end inside each carries the same name as
its namespace, so ``ip link`` inside a namespace tells which lab it belongs to. ``L`` is either

- ``zc<pid>x<n>``: owned by process <pid> (its n-th lab). When <pid> is gone the lab is stale and
  the sweeper removes it, so even ``kill -9`` leaves no permanent litter;
- ``zcup<n>``: made by ``zcnet lab up`` to outlive the command; removed only by ``lab down NAME``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

IFNAMSIZ = 16  # linux/if.h: names hold at most 15 characters plus NUL
SIDES = ("a", "b")

_OWNED = re.compile(r"zc(?P<pid>[1-9][0-9]*)x(?P<n>[0-9]+)")
_PERSISTENT = re.compile(r"zcup(?P<n>[0-9]+)")


@dataclass(frozen=True)
class LabName:
    name: str
    owner: int | None  # None for persistent labs

    @property
    def ns_a(self) -> str:
        return self.name + "a"

    @property
    def ns_b(self) -> str:
        return self.name + "b"

    @property
    def namespaces(self) -> tuple[str, str]:
        return self.ns_a, self.ns_b


def owned(pid: int, n: int) -> LabName:
    return LabName(f"zc{pid}x{n}", pid)


def persistent(n: int) -> LabName:
    return LabName(f"zcup{n}", None)


def fits(lab: LabName) -> bool:
    """Both interface names fit in IFNAMSIZ."""
    return len(lab.ns_a) < IFNAMSIZ


def parse_lab(name: str) -> LabName | None:
    """The lab called NAME, or None if NAME is not a zcnet lab name."""
    if m := _OWNED.fullmatch(name):
        return LabName(name, int(m["pid"]))
    if _PERSISTENT.fullmatch(name):
        return LabName(name, None)
    return None


def parse_netns(ns: str) -> LabName | None:
    """The lab a namespace name belongs to, or None for foreign namespaces."""
    if len(ns) < 2 or ns[-1] not in SIDES:
        return None
    return parse_lab(ns[:-1])


def pid_alive(pid: int) -> bool:
    """True if PID runs. A zombie counts as dead: it will never tear its labs down."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    # The state letter follows the parenthesised command name, which may itself hold ')'.
    state = stat[stat.rfind(")") + 2:stat.rfind(")") + 3]
    if state in ("Z", "X"):
        return False
    return os.path.isdir(f"/proc/{pid}")
