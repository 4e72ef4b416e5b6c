"""PNG plots: produced with the fixed pixel size, and a clear error when matplotlib is missing."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from report_docs import FIX, load, record
from zcnet.cli import main
from zcnet.errors import ZcnetError
from zcnet.report import plots

WIDTH, HEIGHT = int(plots.FIGSIZE[0] * plots.DPI), int(plots.FIGSIZE[1] * plots.DPI)


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert head[12:16] == b"IHDR"
    w, h = struct.unpack(">II", head[16:24])
    return w, h


@pytest.mark.parametrize(("fixture", "expected"), [
    ("mlx5-zcrx", ["mlx5-zcrx-throughput-vs-mtu.png", "mlx5-zcrx-cpu-breakdown.png"]),
    ("tx-mpwqe", ["tx-mpwqe-pps-per-mode.png"]),
    ("zcrx-refs", ["zcrx-refs-cpu-breakdown.png"]),
])
def test_plots_have_expected_size(fixture: str, expected: list[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    doc = json.loads((FIX / f"{fixture}.json").read_text())
    paths = plots.plot_all(record(doc), tmp_path)
    assert [p.name for p in paths] == expected
    for p in paths:
        assert png_size(p) == (WIDTH, HEIGHT)
        assert p.stat().st_size > 5000  # axes, bars and labels, not an empty canvas
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(expected)  # no temp files left


def test_missing_matplotlib_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    doc = json.loads((FIX / "tx-mpwqe.json").read_text())
    with pytest.raises(ZcnetError) as info:
        plots.plot_all(record(doc), tmp_path)
    assert "matplotlib" in info.value.message
    # matplotlib is a dependency: the fix is to install it, not an extra that no longer exists.
    assert "pip install matplotlib" in (info.value.hint or "")


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
        plot_all(record(doc), tmp_path, [first])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_plots_say_what_they_show(tmp_path: Path) -> None:
    """Titled in words, the error bars named, the substitutions named (in the PNG's text)."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    doc = load("mlx5-zcrx")
    by_mtu, cpu = plots.plot_all(record(doc), tmp_path)
    meta = Image.open(by_mtu).text
    assert meta["Title"] == f"{doc['experiment']['title']}: throughput by MTU"
    assert "points: mean of up to 3 runs per cell; error bars: ± 1 standard deviation" in \
        meta["Description"]
    assert "substituted: engine zcrx runs as soft-zc" in meta["Description"]
    assert "Linux 6.18.44-fc-v595, 2 CPUs, AMD EPYC" in meta["Description"]
    cpu_meta = Image.open(cpu).text
    assert cpu_meta["Title"].endswith(": where the CPU time went")
    assert "the shares add up to 100 %" in cpu_meta["Description"]
    # A bench file: medians with their range, as its table shows them.
    bench = load("bench-a")
    bench["kind"] = "bench"
    (path, _) = plots.plot_all(record(bench), tmp_path, stem="b")
    assert "error bars: lowest to highest run" in Image.open(path).text["Description"]
    assert "not plotted (no value): zcrx (unsupported)" in Image.open(path).text["Description"]
