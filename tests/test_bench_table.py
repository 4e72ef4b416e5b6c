"""The bench table and its notes, from recorded-shape results (no sockets), rendered the way
`zcnet bench` prints them, at the 80 columns of a default terminal."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console

import report_docs
from report_docs import bench_rows, record
from zcnet.bench.records import ResultFile
from zcnet.report.bench_table import bench_legend, bench_notes, print_report

PEERS = ("iperf3", "sockperf")
ENGINES = (*report_docs.ENGINES, *PEERS)


def _cell(engine: str, mtu: int, placement: str, status: str = "ok", **kw: Any) -> dict[str, Any]:
    base = {"engine": engine, "mtu": mtu, "placement": placement, "status": status,
            "reason": kw.pop("reason", "")}
    if status == "ok":
        base.update(gbps=kw.pop("gbps", 10.0), cpu={"rx": {"busy": kw.pop("busy", 80.0)}})
    base.update(kw)
    return base


def _doc(results: list[dict[str, Any]], lab: bool = True, **extra: Any) -> ResultFile:
    return record({"env": {"lab": lab, "target": {"note": "loopback (127.0.0.1), not a lab"}},
                   "results": results, **extra})


def render(doc: ResultFile, width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    print_report(doc, console)
    return console.export_text()


def assert_fits(text: str, width: int = 80) -> None:
    too_long = [line for line in text.splitlines() if len(line.rstrip()) > width]
    assert not too_long, "\n".join(too_long)


def test_table_has_a_block_per_placement_and_na_cells() -> None:
    why = "device lacks queue management ops or header-data split"
    doc = _doc([_cell(e, m, p) for p in ("same", "split") for m in (1500, 9000)
                for e in ("epoll", "uring")]
               + [_cell("zcrx", m, p, "unsupported", reason=why)
                  for p in ("same", "split") for m in (1500, 9000)])
    text = render(doc)
    assert_fits(text)
    assert text.count("Gbit/s (CPU busy %) · placement") == 2
    assert "10.0 (80%)" in text and "n/a" in text
    assert "Gbps" not in text  # one spelling of the unit
    assert f"unsupported: zcrx (all cells): {why}" in " ".join(text.split())
    assert bench_notes(doc) == [f"unsupported: zcrx (all cells): {why}"]
    # The legend says what the percentage is, and that the CPU runs more than the app.
    (legend,) = bench_legend(doc)
    assert "100 - %idle - %iowait" in legend and "receive softirq" in legend


def test_many_engines_repeats_and_warnings_fit_80_columns() -> None:
    """The default engines, both peers, three MTUs, both placements, three repeats each with
    a range line, warnings and failures: readable at 80 columns, no name or number cut."""
    def ok(rep: int, p: str, m: int, i: int, e: str) -> dict[str, Any]:
        if e == "uring" and rep == 1:
            return {"status": "error", "reason": "flow failed"}
        return {"gbps": 10.0 + i + rep / 3, "cpu": {"rx": {"busy": 99.0}},
                "interval_cv": 0.2 if e == "epoll" else 0.01,
                "warnings": ["rate not steady: ..."] if e == "epoll" else [],
                **({"peer": e} if e in PEERS else {})}

    rows = bench_rows(ENGINES, ok)
    doc = _doc(rows, warnings=["machine busy before the run: 1-minute load average 3.10 on "
                               "2 CPUs; results may be low and spread"])
    text = render(doc)
    assert_fits(text)
    words = set(re.findall(r"[\w.-]+", text))
    assert set(ENGINES) <= words  # every name whole, never folded into pieces
    assert "12.3 (99%)" in text and "[12.0..12.7]" in text and "1/3 failed" in text
    # Too many engines across: the table turned, engines down, MTUs across.
    assert "MTU 1500" in text and "MTU 9000" in text
    flat = " ".join(text.split())
    assert "warning: machine busy before the run" in flat
    # The spread warning once per cell, not once per repeat.
    assert flat.count("warning: epoll mtu 1500 same: rate not steady in 3 of 3 repeats") == 1


FALLBACK = {"kind": "sendzc", "path": "copy", "note": "sendzc unavailable, sent by copy: EPERM"}


def test_notes_name_partial_failures_mismatches_fallbacks_and_loopback() -> None:
    doc = _doc([
        _cell("epoll", 1500, "same", verify={"checked_bytes": 100, "mismatches": 3},
              tx_stats=FALLBACK),
        _cell("epoll", 1500, "split", "error", reason="tx worker died (exit code -9)"),
        _cell("uring", 1500, "same", tx_stats=FALLBACK),
    ], lab=False)
    notes = bench_notes(doc)
    assert "verify: epoll mtu 1500 same: 3 of 100 bytes wrong" in notes
    assert "error: epoll (mtu 1500 split): tx worker died (exit code -9)" in notes
    assert notes.count("sender: sendzc unavailable, sent by copy: EPERM") == 1
    assert notes[-1] == "loopback (127.0.0.1), not a lab"


def test_cpu_not_sampled_reads_na_never_zero() -> None:
    doc = _doc([{**_cell("epoll", 1500, "same"), "cpu": {"rx": None, "tx": None}}])
    text = render(doc)
    assert "10.0 (CPU n/a)" in text and "(0%)" not in text
    assert any(n.startswith("CPU n/a: epoll mtu 1500 same") for n in bench_notes(doc))
