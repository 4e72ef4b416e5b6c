"""Is the machine quiet enough to believe one run? The load average before and after it, the
tasks that ran beside each flow (zcnet.bench.intervals), and other zcnet labs up meanwhile,
turned into warnings a run's table prints and its JSON keeps (``env.machine``, ``warnings``).

Some facts: the load average is a decaying mean over about a minute, so "before" also says
what ran in the minute before the run, and "after" holds the run's own flows (up to two busy
tasks per flow in a lab); that is why the run-time judgement uses the running tasks sampled
beside each flow instead, minus the flow's own.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from zcnet.bench.records import Machine, ResultRow
from zcnet.lab.sweep import find_labs

# More than this many tasks per usable CPU besides ours: the machine was busy.
BUSY_PER_CPU = 0.5


def load_average(path: str = "/proc/loadavg") -> list[float] | None:
    """The 1, 5 and 15-minute load averages, or None where they cannot be read."""
    try:
        return [float(x) for x in Path(path).read_text().split()[:3]]
    except (OSError, ValueError):
        return None


def other_labs() -> list[str]:
    """zcnet labs of other processes that are up now (persistent ones included)."""
    return sorted(name for name, info in find_labs().items()
                  if info.alive and info.owner != os.getpid())


def before() -> Machine:
    """The machine's state as a run starts, for its ``env.machine``."""
    return Machine(cpus_usable=len(os.sched_getaffinity(0)), load_before=load_average(),
                   other_labs=other_labs())


def after(state: Machine) -> None:
    """Add the state as the run ends; labs that came up meanwhile join the list."""
    state.load_after = load_average()
    state.other_labs = sorted({*state.other_labs, *other_labs()})


def warnings(state: Machine, rows: list[ResultRow]) -> list[str]:
    """What says the machine was not quiet: load before the run, tasks running beside the
    flows during it (the median over the cells that sampled them), other labs."""
    out = []
    cpus = max(1, state.cpus_usable or 1)
    limit = max(1.0, BUSY_PER_CPU * cpus)
    load = state.load_before
    if load and load[0] >= limit:
        out.append(f"machine busy before the run: 1-minute load average {load[0]:.2f} on "
                   f"{cpus} CPUs; results may be low and spread, rerun on a quieter machine")
    beside = [r.others_running for r in rows if r.others_running is not None]
    # More than the limit: one of the tasks counted may be the flow's own ksoftirqd.
    if beside and (median := statistics.median(beside)) > limit:
        out.append(f"machine busy during the run: a median of {median:g} tasks ran beside each "
                   f"flow's own on {cpus} CPUs (running tasks sampled during every cell); "
                   "results may be low and spread")
    if state.other_labs:
        out.append(f"other zcnet labs were up: {', '.join(state.other_labs)}; their "
                   "traffic shares this machine's CPUs")
    return out
