"""Review findings in report/ and the run/compare CLI: output files that cannot be written, specs
with malformed [[substitute]] entries, and verdicts on cells whose mean is zero or missing."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from zcnet.bench.experiments import iter_run
from zcnet.bench.spec import SpecError, builtin_spec, parse_spec
from zcnet.cli import main
from zcnet.errors import ZcnetError
from zcnet.report.export import write_text
from zcnet.report.stats import welch
from zcnet.report.tables import experiment_tables

FIX = Path(__file__).parent / "fixtures"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIX / f"{name}.json").read_text())


# --- unwritable outputs: one error line, no traceback, no litter ------------------------------


@pytest.mark.parametrize("option", ["--csv", "--markdown", "--json"])
def test_compare_to_a_missing_directory_is_an_error_not_a_traceback(
        tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "out"
    rc = main(["compare", str(FIX / "bench-a.json"), str(FIX / "bench-b.json"), option,
               str(target)])
    assert rc != 0
    err = capsys.readouterr().err
    assert "zcnet: error:" in err and str(target) in err


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


def test_unwritable_json_fails_before_the_first_cell(tmp_path: Path) -> None:
    measured = []

    def measure(spec: Any, cell: dict[str, Any], target: Any) -> list[dict[str, Any]]:
        measured.append(cell)
        return [{"status": "ok", "gbps": 1.0}]

    spec = builtin_spec(next(iter(["zcrx-refs"])))
    with pytest.raises(ZcnetError):
        for _ in iter_run(spec, json_path=tmp_path / "missing" / "r.json", measure=measure):
            pass
    assert measured == []  # no minutes of measuring thrown away at the first write


# --- specs -------------------------------------------------------------------------------------

SPEC = """[experiment]
name = "x"
title = "t"
tool = "bench"
[matrix]
engine = ["epoll"]
mtu = [1500]
[report]
rows = "engine"
columns = "mtu"
"""


@pytest.mark.parametrize("subs", ["substitute = [1]", 'substitute = ["epoll"]'])
def test_substitute_entries_must_be_tables(subs: str) -> None:
    with pytest.raises(SpecError, match=r"substitute\[0\]"):
        parse_spec(subs + "\n" + SPEC)


# --- verdicts ----------------------------------------------------------------------------------


def test_verdict_against_a_zero_mean_names_the_right_direction() -> None:
    v = welch([0.0, 0.0, 0.0], [10.0, 11.0, 12.0])
    assert v.significant
    assert "nan" not in v.text()
    assert "faster" in v.text()
    v = welch([10.0, 11.0, 12.0], [0.0, 0.0, 0.0])
    assert "nan" not in v.text() and "slower" in v.text()


def _tx_doc() -> dict[str, Any]:
    return copy.deepcopy(load("tx-mpwqe"))


def test_ab_cell_without_the_metric_is_na_not_a_crash() -> None:
    doc = _tx_doc()
    for row in doc["results"]:
        if row.get("mode") == "gso":
            row.pop("mpps", None)
    (table,) = experiment_tables(doc)
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
    (table,) = experiment_tables(doc)
    text = " ".join(" ".join(r) for r in table.rows)
    assert "nan" not in text and "inf" not in text


def test_plots_into_an_uncreatable_directory(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc = main(["run", "--report", str(FIX / "mlx5-zcrx.json"), "--plots", str(blocker / "p")])
    assert rc != 0
    assert "zcnet: error:" in capsys.readouterr().err


def test_plot_onto_a_directory_leaves_no_temp_file(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from zcnet.report.plots import plot_all

    doc = load("mlx5-zcrx")
    first = doc["report"]["plots"][0]
    (tmp_path / f"{doc['experiment']['name']}-{first}.png").mkdir()
    with pytest.raises(ZcnetError):
        plot_all(doc, tmp_path, [first])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
