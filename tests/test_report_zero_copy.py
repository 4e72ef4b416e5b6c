"""Every report shows the kernel's copies where a receiver counted them: the zero-copy share per
bench cell, per experiment row and per client flow; "unknown" with the reason where the kernel
has no counter (never 0); nothing for an engine that copies by design."""

from __future__ import annotations

from rich.console import Console

from zcnet.bench.client import ClientResult
from zcnet.bench.records import ClientSummary, CpuPair, CpuShares, Env, ResultFile, ResultRow
from zcnet.cli.client import tables as client_tables
from zcnet.report.bench_table import bench_legend, bench_notes, print_report, repeats_text
from zcnet.report.tables import ab, grid

NO_STATS = "zcrx events and statistics need Linux 7.2 (this kernel has none)"


def _stats(share: float | None, copied: int | None, source: str) -> dict[str, object]:
    return {"kernel_copied_bytes": copied, "kernel_copied_source": source,
            "zero_copy_share": share}


def _row(engine: str, stats: dict[str, object] | None, gbps: float = 10.0, mtu: int = 1500,
         **kw: object) -> ResultRow:
    return ResultRow(engine=engine, mtu=mtu, placement="same", status="ok", gbps=gbps,
                     bytes=1 << 30, engine_stats=stats,  # type: ignore[arg-type]
                     cpu=CpuPair(rx=CpuShares(idle=40.0, iowait=0.0, busy=60.0)), **kw)


ROWS = [_row("epoll", {"rounds": 5}),
        _row("zcrx", _stats(1.0, 0, "zcrx_stats.copy_bytes")),
        _row("soft-zc", _stats(0.0, 1 << 30, "the soft provider copies every byte")),
        _row("devmem", _stats(None, None, NO_STATS))]


def test_rows_read_the_share_from_the_engine_stats() -> None:
    epoll, zcrx, soft, unknown = ROWS
    assert not epoll.tracks_copies() and epoll.zero_copy_share() is None
    assert zcrx.zero_copy_share() == 100.0 and soft.zero_copy_share() == 0.0
    assert unknown.tracks_copies() and unknown.zero_copy_share() is None
    assert unknown.zero_copy_reason() == NO_STATS and zcrx.zero_copy_reason() is None
    assert epoll.zero_copy_reason() is None  # a copying engine: nothing to explain


def test_experiment_grid_shows_the_share_per_row_and_unknown_with_its_reason() -> None:
    rows = [*ROWS, *(_row(r.engine or "", r.engine_stats, mtu=9000) for r in ROWS)]
    (table,) = grid("t", rows, rows="mtu", columns="engine", metric="gbps", extra=["rx_busy"])
    assert table.headers == ["MTU", "epoll", "zcrx", "soft-zc", "devmem"]
    for line in table.rows:  # every MTU row
        epoll, zcrx, soft, unknown = line[1:]
        assert "zero-copy" not in epoll
        assert zcrx.endswith("60% CPU, 100% zero-copy")
        assert soft.endswith("0% zero-copy")
        assert unknown.endswith("unknown zero-copy") and "0% zero-copy" not in unknown
    assert any(n.startswith("N% zero-copy: of the bytes received") for n in table.notes)
    assert ("zero-copy unknown (engine=devmem placement=same mtu=1500; engine=devmem "
            f"placement=same mtu=9000): {NO_STATS}") in table.notes


def test_grid_without_a_counting_receiver_adds_nothing() -> None:
    (table,) = grid("t", [ROWS[0]], rows="mtu", columns="engine", metric="gbps")
    assert table.rows == [["1500", "10.00"]]
    assert not any("zero-copy" in n for n in table.notes)


def test_ab_table_has_a_zero_copy_column_and_the_reason_when_all_are_unknown() -> None:
    t = ab("t", ROWS[:3], baseline={"engine": "epoll"}, metric="gbps")
    assert t.headers[-2] == "zero-copy share"
    assert [r[-2] for r in t.rows] == ["n/a", "100%", "0%"]
    only_unknown = ab("t", [ROWS[0], ROWS[3]], baseline={"engine": "epoll"}, metric="gbps")
    assert "zero-copy share" not in only_unknown.headers
    assert f"n/a: zero-copy share: {NO_STATS}" in only_unknown.notes


def test_bench_table_cells_legend_and_notes() -> None:
    doc = ResultFile(kind="bench", env=Env(lab=True), results=list(ROWS))
    console = Console(width=80, record=True, color_system=None)
    print_report(doc, console)
    text = console.export_text()
    assert "zc 100%" in text and "zc 0%" in text and "zc ?" in text
    assert any(line.startswith("zc N%: of the bytes received")
               or "; zc N%: of the bytes received" in line for line in bench_legend(doc))
    assert f"zc ?: devmem mtu 1500 same: zero-copy share unknown: {NO_STATS}" in bench_notes(doc)
    row = next(line for line in text.splitlines() if " 1500 " in line)
    assert max(map(len, text.splitlines())) <= 80  # four engines still fit
    assert row.count("zc ") == 3 and "(60%) │" in row  # zcrx, soft-zc, devmem; never epoll


def test_repeated_cell_reads_the_median_share_and_unknown_when_one_repeat_is() -> None:
    reps = [_row("zcrx", _stats(s, None, "zcrx_stats.copy_bytes"), repeat=i)
            for i, s in enumerate((0.5, 1.0, 0.9))]
    assert "zc 90%" in repeats_text(reps).plain
    reps[1].engine_stats = _stats(None, None, NO_STATS)  # type: ignore[assignment]
    assert "zc ?" in repeats_text(reps).plain


def test_client_flows_table_has_a_zero_copy_column() -> None:
    flows = [_row("zcrx", _stats(1.0, 0, "zcrx_stats.copy_bytes"), flow=0),
             _row("zcrx", _stats(None, None, NO_STATS), flow=1),
             ResultRow(flow=2, status="error", reason="rx worker died")]
    result = ClientResult(flows, ClientSummary(mode="stream", flows=3, ok=2, gbps=20.0), {}, {})
    flow_table, _ = client_tables(result)
    col = flow_table.headers.index("zc %")
    assert [r[col] for r in flow_table.rows] == ["100", "?", "n/a"]
    assert f"flow 1: zero-copy share unknown: {NO_STATS}" in flow_table.notes
    plain = client_tables(ClientResult([_row("epoll", None, flow=0)],
                                       ClientSummary(mode="stream", flows=1, ok=1), {}, {}))[0]
    assert "zc %" not in plain.headers
