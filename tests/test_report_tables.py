"""Tables, Markdown and CSV rendered from recorded result files match the expected text."""

from __future__ import annotations

import copy
import csv
import io
import sys
from pathlib import Path
from typing import Any

import pytest

from report_docs import FIX, load, record
from zcnet.cli import main
from zcnet.errors import ZcnetError
from zcnet.report.export import to_csv, to_markdown, to_text, write_text
from zcnet.report.tables import experiment_tables

RECORDED = ("mlx5-zcrx", "tx-mpwqe", "zcrx-refs")



@pytest.mark.parametrize("name", RECORDED)
def test_markdown_matches_expected(name: str) -> None:
    assert to_markdown(experiment_tables(record(load(name)))) == \
        (FIX / f"{name}.expected.md").read_text()


@pytest.mark.parametrize("name", RECORDED)
def test_terminal_text_matches_expected(name: str) -> None:
    assert to_text(experiment_tables(record(load(name))), width=120) == \
        (FIX / f"{name}.expected.txt").read_text()


def test_grid_is_the_seed_table_with_stats_and_notes() -> None:
    (table,) = experiment_tables(record(load("mlx5-zcrx")))
    assert table.headers == ["MTU", "epoll", "uring", "soft-zc"]
    assert [r[0] for r in table.rows] == ["1500", "4096", "9000"]
    # 1500/epoll repeats 11.2, 11.6, 11.4: mean 11.40, sample stdev 0.20; CPU 99% busy.
    assert table.rows[0][1] == "11.40 ± 0.20, 99% CPU"
    assert table.title.endswith(": throughput in Gbit/s, mean ± stdev")  # the unit, once
    assert any(n.startswith("N% CPU: how busy the CPU the receiving application") for n in
               table.notes)
    assert any(n.startswith("substituted: engine zcrx runs as soft-zc") for n in table.notes)
    # 9000/soft-zc repeats 24, 30, 36: stdev 6 = 20% of the mean, so it is flagged.
    unstable = [n for n in table.notes if n.startswith("warning:")]
    assert len(unstable) == 1 and "mtu=9000" in unstable[0] and "20%" in unstable[0]


def test_ab_table_reports_missing_counters_instead_of_zero() -> None:
    (table,) = experiment_tables(record(load("tx-mpwqe")))
    assert table.headers == ["mode", "packet rate", "CPU per packet", "vs baseline"]
    assert [r[0] for r in table.rows] == ["single", "mmsg", "uring", "gso"]
    assert table.rows[0][-1] == "baseline"
    assert "n/a: instructions per packet, cycles per packet: no hardware counters" in table.notes


def test_mpstat_tables_per_cell() -> None:
    tables = experiment_tables(record(load("zcrx-refs")))
    mp = [t for t in tables if t.headers[0] == "CPU"]
    assert len(mp) == 4
    assert mp[0].headers == ["CPU", "%usr", "%sys", "%iowait", "%irq", "%soft", "%idle"]
    assert mp[0].rows == [["0", "4.90", "63.68", "0.00", "1.64", "2.84", "26.94"],
                          ["1", "0.00", "0.00", "0.00", "0.30", "89.50", "10.20"]]
    # 15.2 Gbit/s = 1900 MB/s, as the seed prints it.
    assert mp[0].title.endswith(": 1900 MB/s")
    # What the shares are, once; the file predates %nice/%steal/%guest: not shown as 0.
    assert mp[-1].notes[-1].startswith("% of each CPU's time")
    assert mp[-1].notes[-1].endswith("%nice, %steal, %guest: not recorded in this file, not shown")


def test_plain_bench_envelope_gets_default_grid_with_na() -> None:
    tables = experiment_tables(record(load("bench-a")))
    (table,) = tables
    assert table.headers == ["MTU", "epoll", "uring", "zcrx"]
    assert table.rows == [["1500", "10.00 ± 0.16, 95% CPU", "12.00 ± 0.16, 95% CPU", "n/a"]]
    assert any("unsupported: device lacks queue management ops" in n for n in table.notes)


def test_csv_has_one_line_per_cell_with_stats() -> None:
    rows = list(csv.DictReader(io.StringIO(to_csv(record(load("mlx5-zcrx")).results))))
    assert len(rows) == 9
    first = rows[0]
    assert (first["engine"], first["mtu"], first["placement"]) == ("epoll", "1500", "same")
    assert float(first["gbps_mean"]) == pytest.approx(11.4)
    assert float(first["gbps_stdev"]) == pytest.approx(0.2)
    assert (first["gbps_min"], first["gbps_max"], first["gbps_n"]) == ("11.2", "11.6", "3")
    assert float(first["mbps_mean"]) == pytest.approx(1425.0)


def test_cli_renders_a_result_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md, cs = tmp_path / "r.md", tmp_path / "r.csv"
    rc = main(["run", "--report", str(FIX / "mlx5-zcrx.json"), "--markdown", str(md),
               "--csv", str(cs)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "11.40 ± 0.20, 99% CPU" in out and "throughput in Gbit/s" in out
    assert md.read_text() == (FIX / "mlx5-zcrx.expected.md").read_text()
    rows = list(csv.DictReader(io.StringIO(cs.read_text())))
    assert len(rows) == 9 and (rows[0]["engine"], rows[0]["mtu"]) == ("epoll", "1500")
    assert float(rows[0]["gbps_mean"]) == pytest.approx(11.4)


def test_ab_table_without_scipy_keeps_the_ratio(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "scipy", None)
    (table,) = experiment_tables(record(load("tx-mpwqe")))
    gso = next(r for r in table.rows if r[0] == "gso")
    assert gso[-1].endswith("x (no verdict: scipy not installed)")


def test_run_report_into_an_uncreatable_out_dir(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc = main(["run", "--report", str(FIX / "mlx5-zcrx.json"), "--out", str(blocker / "sub")])
    assert rc != 0
    assert "zcnet: error:" in capsys.readouterr().err


def test_write_text_onto_a_directory_leaves_no_temp_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(ZcnetError):
        write_text(tmp_path / "d", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def _tx_doc() -> dict[str, Any]:
    return copy.deepcopy(load("tx-mpwqe"))


def test_ab_cell_without_the_metric_is_na_not_a_crash() -> None:
    doc = _tx_doc()
    for row in doc["results"]:
        if row.get("mode") == "gso":
            row.pop("mpps", None)
    (table,) = experiment_tables(record(doc))
    gso = next(r for r in table.rows if r[0] == "gso")
    assert gso[1] == "n/a"


@pytest.mark.parametrize("scipy", [True, False])
def test_ab_against_a_zero_baseline(monkeypatch: pytest.MonkeyPatch, scipy: bool) -> None:
    if not scipy:
        monkeypatch.setitem(sys.modules, "scipy", None)
    doc = _tx_doc()
    for row in doc["results"]:
        if row.get("mode") == "single":
            row["mpps"] = 0.0
    (table,) = experiment_tables(record(doc))
    text = " ".join(" ".join(r) for r in table.rows)
    assert "nan" not in text and "inf" not in text


def test_per_cpu_columns_steal_shown_where_measured_and_na_never_zero() -> None:
    """A VM's stolen time gets its column when some CPU had it; a share a row did not record
    reads n/a, not 0.00."""
    doc = copy.deepcopy(load("zcrx-refs"))
    full = {"usr": 10.0, "nice": 0.0, "sys": 20.0, "iowait": 5.0, "irq": 1.0, "soft": 4.0,
            "steal": 7.5, "guest": 0.0, "idle": 52.5}
    for row in doc["results"]:
        row["cpus"]["0"] = dict(full)
    tables = [t for t in experiment_tables(record(doc)) if t.headers[0] == "CPU"]
    assert tables[0].headers == ["CPU", "%usr", "%sys", "%iowait", "%irq", "%soft", "%steal",
                                 "%idle"]
    assert tables[0].rows[0] == ["0", "10.00", "20.00", "5.00", "1.00", "4.00", "7.50", "52.50"]
    assert tables[0].rows[1][6] == "n/a"  # CPU 1's row has no steal recorded
    assert "%nice, %guest: 0 wherever recorded, not shown" in tables[-1].notes[-1]
