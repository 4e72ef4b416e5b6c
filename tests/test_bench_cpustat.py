"""Per-CPU shares from /proc/stat: every field where it belongs, adding up to 100, and carried
into the bench's rows and tables (iowait used to be dropped on the way and read 0)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from zcnet.bench.client import ClientResult
from zcnet.bench.cpustat import SHARES, CpuTimes, shares
from zcnet.bench.records import (
    ClientSummary,
    CpuShares,
    ReportSection,
    ResultFile,
    ResultRow,
    RoleShares,
)
from zcnet.bench.run import flow_cell
from zcnet.report.tables import experiment_tables

HEAD = "cpu  0 0 0 0 0 0 0 0 0 0\n"


def _stat(tmp_path: Path, name: str, *lines: str) -> str:
    p = tmp_path / name
    p.write_text(HEAD + "".join(f"{line}\n" for line in lines) + "intr 0\nctxt 0\n")
    return str(p)


def test_real_proc_stat_shares_add_up_to_100() -> None:
    cpu = min(os.sched_getaffinity(0))
    before = CpuTimes.read()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # give the kernel ticks to count
        pass
    got = CpuTimes.read().since(before)
    assert cpu in got
    sampled = {c: s for c, s in got.items() if s.sampled}
    assert sampled, "no CPU counted a tick in 0.3 s of spinning"
    for c, s in sampled.items():
        values = vars(s)
        assert None not in values.values() and set(values) == {*SHARES, "busy"}, c
        assert all(v >= 0 for v in values.values()), s
        assert sum(values[k] for k in SHARES) == pytest.approx(100.0, abs=0.06), s
        assert values["busy"] == pytest.approx(100.0 - values["idle"] - values["iowait"],
                                               abs=0.02)


def test_each_field_lands_in_its_share_and_guest_is_counted_once(tmp_path: Path) -> None:
    """proc(5): user nice system idle iowait irq softirq steal guest guest_nice; guest time is
    inside user (guest_nice inside nice), so counting it again would pass 100%."""
    a = CpuTimes.read(_stat(tmp_path, "a", "cpu0 1000 100 1000 1000 1000 1000 1000 1000 50 5"))
    b = CpuTimes.read(_stat(tmp_path, "b", "cpu0 1600 150 1100 1100 1050 1010 1040 1050 150 25"))
    assert a.since(a) == {0: CpuShares()}  # no tick: nothing sampled, not an idle CPU
    s = b.since(a)[0]
    # Deltas: user 600 (guest 100 of it), nice 50 (guest_nice 20), system 100, idle 100,
    # iowait 50, irq 10, softirq 40, steal 50: 1000 ticks.
    assert s == CpuShares(usr=50.0, nice=3.0, sys=10.0, iowait=5.0, irq=1.0, soft=4.0,
                          steal=5.0, guest=12.0, idle=10.0, busy=85.0)
    assert sum(s.share(k) or 0.0 for k in SHARES) == 100.0


def test_older_kernels_with_fewer_fields(tmp_path: Path) -> None:
    a = CpuTimes.read(_stat(tmp_path, "a", "cpu0 0 0 0 0 0 0 0"))
    b = CpuTimes.read(_stat(tmp_path, "b", "cpu0 30 0 20 40 10 0 0"))
    s = b.since(a)[0]
    assert (s.usr, s.sys, s.idle, s.iowait, s.guest) == (30.0, 20.0, 40.0, 10.0, 0.0)
    assert shares(np.zeros(8, dtype=np.int64)) == CpuShares()


def test_a_counter_stepping_back_is_not_a_negative_share(tmp_path: Path) -> None:
    """The kernel estimates per-CPU iowait and it can step back between two reads."""
    a = CpuTimes.read(_stat(tmp_path, "a", "cpu0 100 0 100 100 500 0 0 0 0 0"))
    b = CpuTimes.read(_stat(tmp_path, "b", "cpu0 150 0 150 200 490 0 0 0 0 0"))
    s = b.since(a)[0]
    assert s.iowait == 0.0 and all((v or 0.0) >= 0 for v in vars(s).values())
    assert sum(s.share(k) or 0.0 for k in SHARES) == pytest.approx(100.0)


def _flow(cpus: dict[str, dict[str, RoleShares]]) -> ClientResult:
    flow = ResultRow(bytes=10, seconds=1.0, gbps=1.0, rx_app_cpu=1, tx_app_cpu=0, rx_cpu=0,
                     tx_cpu=0, rx_cpu_end=0)
    return ClientResult([flow], ClientSummary(flows=1, ok=1, mode="stream"), cpus, {})


def test_iowait_reaches_the_bench_row_and_the_per_cpu_table(tmp_path: Path) -> None:
    """The server's shares (as cpustat gives them) go into the bench row whole; the per-CPU
    table of an experiment shows the iowait measured, not 0."""
    a = CpuTimes.read(_stat(tmp_path, "a", "cpu0 0 0 0 0 0 0 0 0 0 0",
                            "cpu1 0 0 0 0 0 0 0 0 0 0"))
    b = CpuTimes.read(_stat(tmp_path, "b", "cpu0 50 0 30 10 0 0 10 0 0 0",
                            "cpu1 20 0 10 45 25 0 0 0 0 0"))
    measured = {str(c): RoleShares(**vars(s)) for c, s in b.since(a).items()}
    cell = flow_cell(_flow({"dst": measured, "src": measured}), 1500, "epoll", "split",
                     tx="copy", consumer="same")
    assert cell.cpu is not None and cell.cpu.rx is not None and cell.cpu.tx is not None
    assert cell.cpu.rx.iowait == 25.0 and cell.cpu.rx.busy == 30.0
    cell.cpus = {"1": cell.cpu.rx, "0": cell.cpu.tx}
    doc = ResultFile(kind="experiment", results=[cell],
                     report=ReportSection(table="mpstat", metric="gbps"))
    (table,) = experiment_tables(doc)
    assert table.headers == ["CPU", "%usr", "%sys", "%iowait", "%irq", "%soft", "%idle"]
    assert table.rows == [["0", "50.00", "30.00", "0.00", "0.00", "10.00", "10.00"],
                          ["1", "20.00", "10.00", "25.00", "0.00", "0.00", "45.00"]]
