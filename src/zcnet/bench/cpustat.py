"""Per-CPU time accounting from /proc/stat deltas (mpstat's method).

Some facts about /proc/stat: each ``cpuN`` line counts USER_HZ ticks in user, nice, system, idle,
iowait, irq, softirq, steal, guest, guest_nice. Guest time is already inside user/nice, so it is
not added again. A delta over an interval divided by its total gives the shares mpstat prints.
A CPU whose counters did not move (an interval shorter than a tick, an offline CPU) has no shares:
callers show n/a for it, never 0%.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


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
            ticks[cpu, : len(vals)] = vals
        return cls(ticks)

    def since(self, earlier: CpuTimes) -> dict[int, dict[str, float]]:
        """Percent of each CPU's time per category between ``earlier`` and now."""
        n = min(len(self.ticks), len(earlier.ticks))
        delta = (self.ticks[:n] - earlier.ticks[:n]).clip(min=0)
        return {cpu: shares(delta[cpu]) for cpu in range(n)}


def shares(delta: np.ndarray) -> dict[str, float]:
    """Percent per category; empty when no tick elapsed (nothing was sampled: an unknown share,
    not an idle CPU)."""
    total = float(delta.sum())
    d = dict(zip(_FIELDS, (float(x) for x in delta), strict=True))
    if total <= 0:
        return {}
    pct = {
        "usr": 100 * (d["user"] + d["nice"]) / total,
        "sys": 100 * d["system"] / total,
        "iowait": 100 * d["iowait"] / total,
        "irq": 100 * d["irq"] / total,
        "soft": 100 * d["softirq"] / total,
        "idle": 100 * d["idle"] / total,
    }
    pct["busy"] = 100.0 - pct["idle"] - pct["iowait"]
    return {k: round(v, 2) for k, v in pct.items()}
