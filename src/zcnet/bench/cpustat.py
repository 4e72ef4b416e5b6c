"""Per-CPU time accounting from /proc/stat deltas (mpstat's method).

Some facts about /proc/stat (proc(5)): each ``cpuN`` line counts USER_HZ ticks in ten fields:
user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice. The first eight add up
to the CPU's time. Guest time is already inside user (and guest_nice inside nice): the kernel
charges a vCPU's run to both, so mpstat shows %usr = user - guest and %nice = nice - guest_nice
next to %guest, and the shares add up to 100 % without counting a guest twice. iowait is idle
time during which a task that last ran on this CPU waited for a block device; it is idle, not
busy, but kept apart as mpstat does. A per-CPU iowait counter can step backwards (the kernel
estimates it); deltas are clipped at 0. A delta over an interval divided by its total gives the
shares. A CPU whose counters did not move (an interval shorter than a tick, an offline CPU) has
no shares: callers show n/a for it, never 0 %.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zcnet.bench.records import SHARE_NAMES, CpuShares

_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest",
           "guest_nice")
_TIME = 8  # the first eight fields make up a CPU's time; guest and guest_nice lie inside them

# The shares of a CPU's time, in mpstat's order; they add up to 100 (CpuShares adds ``busy``).
SHARES = tuple(name for name in SHARE_NAMES if name != "busy")


@dataclass(frozen=True)
class CpuTimes:
    """Raw tick counters per CPU: shape (ncpu, len(_FIELDS))."""

    ticks: np.ndarray

    @classmethod
    def read(cls, path: str = "/proc/stat") -> CpuTimes:
        rows: dict[int, list[int]] = {}
        for line in Path(path).read_text().splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *vals = line.split()
                rows[int(name[3:])] = [int(v) for v in vals[: len(_FIELDS)]]
        ncpu = max(rows) + 1 if rows else 0
        ticks = np.zeros((ncpu, len(_FIELDS)), dtype=np.int64)
        for cpu, vals in rows.items():
            ticks[cpu, : len(vals)] = vals  # older kernels have fewer fields: those read 0
        return cls(ticks)

    def since(self, earlier: CpuTimes) -> dict[int, CpuShares]:
        """Percent of each CPU's time per category between ``earlier`` and now."""
        n = min(len(self.ticks), len(earlier.ticks))
        delta = (self.ticks[:n] - earlier.ticks[:n]).clip(min=0)
        return {cpu: shares(delta[cpu]) for cpu in range(n)}


def shares(delta: np.ndarray) -> CpuShares:
    """Percent per category (``SHARES``, adding up to 100) and ``busy`` (100 - idle - iowait);
    none when no tick elapsed (nothing was sampled: an unknown share, not an idle CPU)."""
    vals = [float(x) for x in delta][: len(_FIELDS)]
    d = dict(zip(_FIELDS, vals + [0.0] * (len(_FIELDS) - len(vals)), strict=True))
    total = sum(vals[:_TIME])
    if total <= 0:
        return CpuShares()
    # A guest share larger than the user time it lies in (the counters are read one after the
    # other, not atomically) is clipped, so no share goes negative.
    guest = min(d["guest"], d["user"])
    guest_nice = min(d["guest_nice"], d["nice"])
    ticks = {
        "usr": d["user"] - guest,
        "nice": d["nice"] - guest_nice,
        "sys": d["system"],
        "iowait": d["iowait"],
        "irq": d["irq"],
        "soft": d["softirq"],
        "steal": d["steal"],
        "guest": guest + guest_nice,
        "idle": d["idle"],
    }
    pct = {k: 100 * v / total for k, v in ticks.items()}
    pct["busy"] = 100.0 - pct["idle"] - pct["iowait"]
    return CpuShares(**{k: round(v, 2) for k, v in pct.items()})
