"""`zcnet bench --repeat N`: interleaved repeats, medians and spread in the table and the JSON,
and a `zcnet compare` verdict between two such runs; bad values are one-line usage errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zcnet.bench.matrix import BenchOptions, peer_ratios, summarize_cells
from zcnet.bench.records import CpuPair, CpuShares, ResultRow, Spread, read_file
from zcnet.errors import UsageError
from zcnet.report.bench_table import repeats_text
from zcnet.report.compare import compare, key_text

pytestmark = pytest.mark.usefixtures("no_leaks")

ZCNET = [sys.executable, "-m", "zcnet"]


def zcnet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ZCNET, *args], capture_output=True, text=True, timeout=timeout)


def row(engine: str, gbps: float | None, busy: float = 50.0, rep: int = 0,
        peer: str | None = None) -> ResultRow:
    r = ResultRow(engine=engine, mtu=9000, placement="split", repeat=rep, peer=peer,
                  status="ok" if gbps is not None else "error",
                  reason="" if gbps is not None else "flow failed")
    if gbps is not None:
        r.gbps, r.cpu = gbps, CpuPair(rx=CpuShares(busy=busy))
    return r


@pytest.mark.parametrize(("value", "needle"), [
    ("0", "1..10000"), ("-2", "1..10000"), ("x", "not a whole number"), ("1.5", "whole"),
    ("10001", "1..10000"),
])
def test_bad_repeat_is_a_one_line_usage_error(value: str, needle: str) -> None:
    r = zcnet("bench", "--no-lab", "--repeat", value, timeout=30)
    assert r.returncode == 2
    assert needle in r.stderr and "repeat" in r.stderr and "Traceback" not in r.stderr


def test_repeat_is_checked_in_the_api_too() -> None:
    with pytest.raises(UsageError, match="repeat"):
        BenchOptions(mtus=(1500,), engines=("epoll",), placements=("same",), repeat=0,
                     lab=False).validate()


def test_summary_has_median_and_spread_of_each_cell() -> None:
    rows = [row("epoll", 30.0, 40, 0), row("uring", 20.0, 60, 0),
            row("epoll", 36.0, 50, 1), row("uring", None, rep=1),
            row("epoll", 33.0, 70, 2), row("uring", 22.0, 80, 2)]
    s = {c.engine: c for c in summarize_cells(rows)}
    assert s["epoll"].n == s["epoll"].ok == 3
    assert s["epoll"].gbps == Spread(median=33.0, min=30.0, max=36.0, stdev=3.0)
    assert s["epoll"].rx_busy is not None and s["epoll"].rx_busy.median == 50
    uring = s["uring"]
    assert uring.gbps is not None and (uring.n, uring.ok, uring.gbps.median) == (3, 2, 21.0)
    one = summarize_cells([row("epoll", 5.0)])[0]
    assert one.gbps == Spread(median=5.0, min=5.0, max=5.0, stdev=0.0)
    assert summarize_cells([row("epoll", None)])[0].gbps is None


def test_table_cell_reads_medians_range_and_failures() -> None:
    rows = [row("epoll", 30.0, 40), row("epoll", 36.0, 50), row("epoll", None),
            row("epoll", 33.0, 70)]
    assert repeats_text(rows).plain == "33.0 (50%)\n[30.0..36.0]\n1/4 failed"
    assert repeats_text(rows[:1]).plain == "30.0 (40%)"
    assert repeats_text([row("epoll", None)]).plain == "error"


def test_peer_ratio_compares_medians() -> None:
    rows = [row("epoll", 30.0), row("iperf3", 40.0, peer="iperf3"),
            row("epoll", 36.0, rep=1), row("iperf3", 20.0, rep=1, peer="iperf3"),
            row("epoll", 33.0, rep=2), row("iperf3", 30.0, rep=2, peer="iperf3")]
    (r,) = peer_ratios(rows)
    assert (r.engine, r.gbps, r.peer_gbps, r.ratio) == ("epoll", 33.0, 30.0, 1.1)


def _bench(tmp_path: Path, name: str) -> tuple[dict[str, Any], str]:
    lo = Path("/sys/class/net/lo/mtu").read_text().strip()
    out = tmp_path / name
    r = zcnet("bench", "--no-lab", "--mtu", lo, "--engine", "epoll,uring", "--placement",
              "same", "--duration", "0.2", "--repeat", "3", "--json", str(out))
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stdout


def test_repeated_bench_interleaves_and_compare_gives_a_verdict(tmp_path: Path) -> None:
    a, table = _bench(tmp_path, "a.json")
    # Interleaved: every repeat runs every cell once, in order.
    assert [(r["engine"], r["repeat"]) for r in a["results"]] == \
        [("epoll", 0), ("uring", 0), ("epoll", 1), ("uring", 1), ("epoll", 2), ("uring", 2)]
    assert all(r["status"] == "ok" for r in a["results"]), a["results"]
    summary = {s["engine"]: s for s in a["summary"]}
    for engine in ("epoll", "uring"):
        g = [r["gbps"] for r in a["results"] if r["engine"] == engine]
        assert summary[engine]["n"] == 3
        assert summary[engine]["gbps"]["median"] == sorted(g)[1]
        assert (summary[engine]["gbps"]["min"], summary[engine]["gbps"]["max"]) == \
            (min(g), max(g))
    assert "[" in table and ".." in table  # the range next to the median
    b, _ = _bench(tmp_path, "b.json")
    rows = {key_text(r.key): r for r in compare(read_file(a), read_file(b))}
    assert len(rows) == 2
    for r in rows.values():
        assert r.a.n == r.b.n == 3 and r.verdict is not None
        assert "needs --repeat" not in r.verdict.text()
    r = zcnet("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert r.returncode == 0, r.stderr
    # Each engine's row ends in a verdict with its p-value, never "no verdict".
    for engine in ("epoll", "uring"):
        assert re.search(rf"^{engine} .* (faster|slower|n\.s\.) p[=<]\d", r.stdout, re.M), \
            r.stdout
    assert "no verdict" not in r.stdout
