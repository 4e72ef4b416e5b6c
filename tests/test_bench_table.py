"""The bench table and its notes, from recorded-shape results (no sockets)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from zcnet.report.bench_table import bench_notes, bench_tables


def _cell(engine: str, mtu: int, placement: str, status: str = "ok", **kw: Any) -> dict[str, Any]:
    base = {"engine": engine, "mtu": mtu, "placement": placement, "status": status,
            "reason": kw.pop("reason", "")}
    if status == "ok":
        base.update(gbps=kw.pop("gbps", 10.0), cpu={"rx": {"busy": 80.0}})
    base.update(kw)
    return base


def _doc(results: list[dict[str, Any]], lab: bool = True) -> dict[str, Any]:
    return {"env": {"lab": lab, "target": {"note": "loopback (127.0.0.1), not a lab"}},
            "results": results}


def test_table_has_a_block_per_placement_and_na_cells() -> None:
    why = "device lacks queue management ops or header-data split"
    doc = _doc([_cell(e, m, p) for p in ("same", "split") for m in (1500, 9000)
                for e in ("epoll", "uring")]
               + [_cell("zcrx", m, p, "unsupported", reason=why)
                  for p in ("same", "split") for m in (1500, 9000)])
    tables = bench_tables(doc)
    assert len(tables) == 2
    console = Console(width=120, record=True)
    for t in tables:
        console.print(t)
    text = console.export_text()
    assert "10.0 Gbps (80%)" in text and "n/a" in text
    notes = bench_notes(doc)
    assert notes == [f"unsupported: zcrx (all cells): {why}"]


def test_notes_name_partial_failures_mismatches_fallbacks_and_loopback() -> None:
    doc = _doc([
        _cell("epoll", 1500, "same", verify={"checked_bytes": 100, "mismatches": 3},
              tx_stats={"note": "sendzc unavailable, sent by copy: EPERM"}),
        _cell("epoll", 1500, "split", "error", reason="tx worker died (exit code -9)",
              tx_stats={}),
        _cell("uring", 1500, "same", tx_stats={"note": "sendzc unavailable, sent by copy: EPERM"}),
    ], lab=False)
    notes = bench_notes(doc)
    assert "verify: epoll mtu 1500 same: 3 of 100 bytes wrong" in notes
    assert "error: epoll (mtu 1500 split): tx worker died (exit code -9)" in notes
    assert notes.count("sender: sendzc unavailable, sent by copy: EPERM") == 1
    assert notes[-1] == "loopback (127.0.0.1), not a lab"
