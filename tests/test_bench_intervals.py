"""How steady a flow was and how busy the machine: the receiver's per-interval samples, the
spread warning, the run-level warnings, and a real loopback bench carrying them in its JSON."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from zcnet.bench import busy, intervals
from zcnet.bench.client import ClientResult
from zcnet.bench.records import ClientSummary, Intervals, Machine, ResultRow
from zcnet.bench.run import flow_cell
from zcnet.cli._progress import CellProgress

pytestmark = pytest.mark.usefixtures("no_leaks")


def _pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        tx = socket.create_connection(ls.getsockname())
        rx, _ = ls.accept()
    return tx, rx


def test_sampler_intervals_add_up_and_a_stall_shows_as_spread() -> None:
    """A real TCP flow on loopback that stops for a while in the middle: the intervals add up
    to every byte the socket received, and the stall makes the rate's spread large."""
    tx, rx = _pair()
    chunk = b"x" * 65536

    def send() -> None:
        with tx:
            for pause in (0.0, 0.35, 0.0):
                time.sleep(pause)
                end = time.monotonic() + 0.3
                while time.monotonic() < end:
                    tx.sendall(chunk)

    got = 0
    with rx, intervals.IntervalSampler(rx, 0.05) as sampler:
        t = threading.Thread(target=send)
        t.start()
        while data := rx.recv(1 << 20):
            got += len(data)
        t.join()
    s = sampler.record()
    assert got > 0 and sum(s.bytes) - got in (0, 1)  # the kernel counts the FIN as a byte
    # The intervals cover the whole flow (0.95 s of sending at least), one after the other.
    assert sum(s.seconds) >= 0.9 and all(x > 0 for x in s.seconds)
    assert len(s.seconds) >= 5
    assert s.running and all(isinstance(n, int) and n >= 0 for n in s.running)
    # Intervals in the stall received nothing: the spread is far beyond the limit.
    assert 0 in s.bytes[1:-1]
    cv = intervals.spread(s)
    assert cv is not None and cv > 0.5


def test_spread_leaves_out_the_ends_and_needs_enough_intervals() -> None:
    steady = Intervals(interval=0.1, seconds=[0.1] * 8,
                       bytes=[10, 100, 100, 100, 100, 100, 100, 3])
    assert intervals.spread(steady) == 0.0  # ramp-up and drain are not spread
    assert intervals.spread(Intervals(interval=0.1, seconds=[0.1] * 5, bytes=[1] * 5)) is None
    assert intervals.spread(None) is None
    assert intervals.others_running(Intervals(interval=0.1, running=[3, 4, 5]), own=2) == 2
    assert intervals.others_running(Intervals(interval=0.1, running=[1, 1]), own=2) == 0
    assert intervals.interval_for(1.0) == 0.1 and intervals.interval_for(60.0) == 3.0


def _flow(samples: Intervals) -> ClientResult:
    flow = ResultRow(bytes=10, seconds=1.0, gbps=1.0, rx_app_cpu=0, tx_app_cpu=0, rx_cpu=0,
                     tx_cpu=0, rx_cpu_end=0, intervals=samples)
    return ClientResult([flow], ClientSummary(flows=1, ok=1, mode="stream"), {}, {})


def test_a_wandering_cell_warns_and_keeps_its_samples() -> None:
    wander = Intervals(interval=0.1, seconds=[0.1] * 8, bytes=[5, 100, 60, 140, 70, 130, 100, 5],
                       running=[4, 4, 5, 4, 4, 4, 4])
    cell = flow_cell(_flow(wander), 1500, "epoll", "same", tx="copy", consumer="same")
    assert cell.intervals == wander
    assert cell.interval_cv == pytest.approx(0.3162, abs=1e-4)  # sqrt(5000/5) / 100
    assert cell.others_running == 2  # 4 running, the flow's receiver and sender its own
    (text,) = cell.warnings
    assert text.startswith("rate not steady: per-interval Gbit/s varied 32%")
    assert "median of 2 other tasks" in text
    steady = replace(wander, bytes=[5, 100, 100, 100, 100, 100, 100, 5])
    quiet = flow_cell(_flow(steady), 1500, "epoll", "same", tx="copy", consumer="same")
    assert quiet.warnings == [] and quiet.interval_cv == 0.0


def test_run_level_warnings() -> None:
    state = Machine(cpus_usable=2, load_before=[3.5, 2.0, 1.0], other_labs=["zc123x1"])
    rows = [ResultRow(others_running=2), ResultRow(others_running=1), ResultRow()]
    load, during, labs = busy.warnings(state, rows)
    assert load.startswith("machine busy before the run: 1-minute load average 3.50 on 2 CPUs")
    assert during.startswith("machine busy during the run: a median of 1.5 tasks")
    assert labs.startswith("other zcnet labs were up: zc123x1")
    quiet = Machine(cpus_usable=2, load_before=[0.2, 0.1, 0.1])
    assert busy.warnings(quiet, [ResultRow(others_running=0)]) == []
    assert busy.load_average("/nonexistent") is None


@pytest.mark.root
def test_another_programs_lab_is_seen(tmp_path: Path) -> None:
    up = subprocess.run([sys.executable, "-m", "zcnet", "lab", "up", "--json"],
                        capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    name = json.loads(up.stdout)["name"]
    try:
        assert name in busy.other_labs()
        state = busy.before()
        assert name in state.other_labs and (state.cpus_usable or 0) >= 1
    finally:
        subprocess.run([sys.executable, "-m", "zcnet", "lab", "down", name], timeout=60,
                       check=True, capture_output=True)
    assert name not in busy.other_labs()


def test_loopback_bench_records_samples_warnings_and_plots(tmp_path: Path) -> None:
    """A real cell on loopback: the row's intervals add up to its bytes, the JSON has the
    machine's state and the run's warnings, the plots sit beside the JSON."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    lo = Path("/sys/class/net/lo/mtu").read_text().strip()
    out = tmp_path / "lo.json"
    r = subprocess.run([sys.executable, "-m", "zcnet", "bench", "--no-lab", "--mtu", lo,
                        "--engine", "epoll", "--placement", "same", "--duration", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    (row,) = doc["results"]
    assert row["status"] == "ok"
    assert sum(row["intervals"]["bytes"]) - row["bytes"] in (0, 1)  # 1: the FIN
    assert len(row["intervals"]["seconds"]) >= 8
    assert isinstance(row["interval_cv"], float) and row["others_running"] >= 0
    machine = doc["env"]["machine"]
    assert len(machine["load_before"]) == 3 and len(machine["load_after"]) == 3
    assert isinstance(doc["warnings"], list)
    # Progress off a terminal: one line per finished cell, no bar.
    assert f"[1/1] bench: epoll mtu {lo} same: " in r.stderr and "Gbit/s" in r.stderr
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["lo-cpu-breakdown.png", "lo-throughput-vs-mtu.png"]
    meta = Image.open(tmp_path / "lo-throughput-vs-mtu.png").text
    assert meta["Title"] == "zcnet bench: one TCP flow per cell: throughput by MTU"
    assert "one run per cell: no error bars" in meta["Description"]
    assert "loopback" in meta["Description"]
    r = subprocess.run([sys.executable, "-m", "zcnet", "bench", "--no-lab", "--mtu", lo,
                        "--engine", "epoll", "--placement", "same", "--duration", "0.2",
                        "--json", str(tmp_path / "quiet.json"), "--no-plots"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("quiet*.png"))


def test_progress_off_a_terminal_is_a_line_per_cell_with_totals() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False, width=200)
    with CellProgress(console, 3, "bench") as p:
        for i in range(3):
            p.start(f"cell {i}")
            p.done(f"cell {i}", f"{i}.0 Gbit/s")
    lines = buf.getvalue().splitlines()
    assert [line.split(" (elapsed")[0] for line in lines] == [
        "[1/3] bench: cell 0: 0.0 Gbit/s", "[2/3] bench: cell 1: 1.0 Gbit/s",
        "[3/3] bench: cell 2: 2.0 Gbit/s"]
    assert "left)" in lines[0] and "left" not in lines[-1]


def test_progress_on_a_terminal_is_a_bar_not_lines() -> None:
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with CellProgress(console, 2, "bench") as p:
        p.start("cell 0")
        p.done("cell 0", "1.0 Gbit/s")
        assert p.eta() is not None
    assert "[1/2]" not in buf.getvalue()  # no log line; the bar was drawn and removed
