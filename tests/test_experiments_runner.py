"""The experiment runner: substitutions, repeats, per-cell JSON, interruption, and a real run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from zcnet.bench.experiments import Cell, ExperimentRig, Measured, iter_run, plan, run_experiment
from zcnet.bench.records import ResultRow, read_file
from zcnet.bench.spec import Spec, builtin_spec, builtin_text, parse_spec
from zcnet.cli import main
from zcnet.errors import Unsupported, ZcnetError
from zcnet.report.tables import experiment_tables

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


def test_lab_substitutes_zero_copy_engine() -> None:
    p = plan(builtin_spec("mlx5-zcrx"), ExperimentRig())
    engines = [c for c in p.cells if "peer" not in c]
    assert {c["engine"] for c in engines} == {"epoll", "uring", "soft-zc"}
    assert len(engines) == 9
    # The C reference runs once per MTU and placement, after the engines.
    assert [(c["peer"], c["mtu"], c["placement"]) for c in p.cells[9:]] == \
        [("iperf3", 1500, "same"), ("iperf3", 4096, "same"), ("iperf3", 9000, "same")]
    (sub,) = p.substitutions
    assert sub.text.startswith("engine zcrx runs as soft-zc: no zcrx-capable NIC")


def test_real_nic_runs_the_real_thing() -> None:
    p = plan(builtin_spec("mlx5-zcrx"), ExperimentRig(ifname="eth2"))
    assert {c["engine"] for c in p.cells if "peer" not in c} == {"epoll", "uring", "zcrx"}
    assert p.substitutions == []


def test_tx_mpwqe_ab_is_the_private_flag_on_a_nic() -> None:
    spec = builtin_spec("tx-mpwqe")
    lab = plan(spec, ExperimentRig())
    assert [c["mode"] for c in lab.cells] == ["single", "mmsg", "uring", "gso"]
    assert "skb_tx_mpwqe private flag needs an mlx5 NIC" in lab.substitutions[0].text
    nic = plan(spec, ExperimentRig(ifname="eth2"))
    assert len(nic.cells) == 8
    assert {c["variant"] for c in nic.cells} == {"skb_tx_mpwqe=off", "skb_tx_mpwqe=on"}
    assert nic.baseline == {"mode": "single", "variant": "skb_tx_mpwqe=off"}
    assert nic.substitutions == []


def _fake_rows(cell: Cell, value: float) -> Measured:
    row = ResultRow(gbps=value, seconds=0.1)
    for axis, v in cell.items():
        row.set_axis(axis, v)
    return Measured([row])


def test_interrupted_run_keeps_measured_cells(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    calls: list[Cell] = []

    def measure(spec: Spec, cell: Cell, target: ExperimentRig) -> Measured:
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(cell)
        return _fake_rows(cell, 10.0 + len(calls))

    with pytest.raises(KeyboardInterrupt):
        run_experiment(builtin_spec("mlx5-zcrx"), json_path=out, measure=measure)
    doc = json.loads(out.read_text())
    assert doc["tool"] == "zcnet" and doc["kind"] == "experiment"
    assert doc["complete"] is False
    assert [(r["mtu"], r["engine"], r["gbps"]) for r in doc["results"]] == \
        [(1500, "epoll", 11.0), (1500, "uring", 12.0)]
    # What survived renders: measured cells show, the rest are simply absent.
    (table,) = experiment_tables(read_file(doc))
    # The fake cells carry no CPU shares: the extra reads n/a, not 0%.
    assert table.rows[0][:3] == ["1500", "11.00, n/a CPU", "12.00, n/a CPU"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_json_is_rewritten_after_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    seen: list[int] = []

    def measure(spec: Spec, cell: Cell, target: ExperimentRig) -> Measured:
        seen.append(len(json.loads(out.read_text())["results"]) if out.exists() else 0)
        return _fake_rows(cell, 5.0)

    spec = dataclasses.replace(builtin_spec("zcrx-refs"))
    doc = run_experiment(spec, json_path=out, measure=measure, repeat=2)
    assert seen == list(range(8))  # cell k sees the k cells measured before it on disk
    assert doc.complete is True
    assert json.loads(out.read_text())["complete"] is True
    # Repeats interleave: every cell once, then every cell again.
    assert [r.repeat for r in doc.results] == [0] * 4 + [1] * 4


def test_a_cell_that_cannot_run_does_not_end_the_run() -> None:
    def measure(spec: Spec, cell: Cell, target: ExperimentRig) -> Measured:
        if cell["engine"] == "uring":
            raise Unsupported("io_uring is disabled", "sysctl kernel.io_uring_disabled=0")
        return _fake_rows(cell, 7.0)

    doc = run_experiment(builtin_spec("mlx5-zcrx"), measure=measure)
    statuses = {(r.engine, r.status) for r in doc.results}
    assert statuses == {("epoll", "ok"), ("uring", "unsupported"), ("soft-zc", "ok"),
                        ("iperf3", "ok")}
    table = experiment_tables(doc)[0]
    assert [row[2] for row in table.rows] == ["n/a"] * 3
    assert any("io_uring is disabled" in n for n in table.notes)


def _small_tx_spec(tmp_path: Path) -> Path:
    text = builtin_text("tx-mpwqe").replace('mode = ["single", "mmsg", "uring", "gso"]',
                                            'mode = ["single", "mmsg"]')
    path = tmp_path / "tx-small.toml"
    path.write_text(text.replace('name = "tx-mpwqe"', 'name = "tx-small"'))
    return path


@pytest.fixture(scope="module")
def fonts_loaded(tmp_path_factory: pytest.TempPathFactory) -> None:
    """matplotlib keeps the font files it has used open for the life of the process (a cache,
    not a leak), and it and scipy (the verdicts) set up memory of their own when first used
    (library data, BLAS buffers): draw and test once before the leak snapshot (module scope:
    set up before any test's no_leaks) so that all this exists already."""
    pytest.importorskip("matplotlib")
    from zcnet.report import plots, stats

    plots.pps_per_mode([ResultRow(mode="x", mpps=1.0)],
                       tmp_path_factory.mktemp("warm") / "w.png")
    stats.welch([1.0, 2.0, 3.0], [2.0, 3.0, 5.0])


@pytest.mark.root
def test_real_tx_experiment_in_the_lab(tmp_path: Path, fonts_loaded: None, no_leaks: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = _small_tx_spec(tmp_path)
    rc = main(["run", str(spec_path), "--repeat", "2", "--duration", "0.2",
               "--out", str(tmp_path / "out")])
    assert rc == 0
    out = capsys.readouterr()
    assert "substituted: A/B skb_tx_mpwqe" in out.err
    # Off a terminal: a line per finished cell with the totals, no bar.
    progress = [line for line in out.err.splitlines() if line.startswith("[")]
    assert [line.split(":")[0] for line in progress] == ["[1/4] tx-small", "[2/4] tx-small",
                                                         "[3/4] tx-small", "[4/4] tx-small"]
    assert "mode=single payload=64 burst=32: " in progress[0] and " Mpps (elapsed " in \
        progress[0] and "left)" in progress[0]
    files = sorted(f.name for f in (tmp_path / "out").iterdir())
    assert files == ["tx-small-pps-per-mode.png", "tx-small.csv", "tx-small.json",
                     "tx-small.md"]
    doc = json.loads((tmp_path / "out" / "tx-small.json").read_text())
    assert doc["complete"] is True
    rows = doc["results"]
    assert [(r["mode"], r["repeat"]) for r in rows] == \
        [("single", 0), ("mmsg", 0), ("single", 1), ("mmsg", 1)]
    for r in rows:
        assert r["status"] == "ok", r.get("reason")
        assert r["mpps"] > 0 and r["ns_per_pkt"] > 0
        assert r["received"] == r["sent"]  # the sink saw every packet: nothing dropped here
    assert "| single |" in (tmp_path / "out" / "tx-small.md").read_text()
    # --json alone: the plots beside it; --no-plots: none.
    rc = main(["run", str(spec_path), "--repeat", "1", "--duration", "0.2",
               "--json", str(tmp_path / "alone.json")])
    assert rc == 0 and (tmp_path / "alone-pps-per-mode.png").is_file()
    rc = main(["run", str(spec_path), "--repeat", "1", "--duration", "0.2",
               "--json", str(tmp_path / "quiet.json"), "--no-plots"])
    assert rc == 0 and not list(tmp_path.glob("quiet*.png"))


BENCH_SPEC = """
[experiment]
name = "small-bench"
title = "epoll in the lab, both placements, iperf3 alongside"
tool = "bench"

[matrix]
engine = ["epoll"]
mtu = [1500]
placement = ["same", "split"]

[run]
duration = 0.3
peers = ["iperf3"]

[report]
table = "grid"
rows = "placement"
columns = "engine"
metric = "gbps"
extra = ["rx_busy"]
per_cpu = true
"""


@pytest.mark.root
def test_real_bench_experiment_in_the_lab(no_leaks: None) -> None:
    import shutil

    if not shutil.which("iperf3"):
        pytest.skip("iperf3 not installed")
    doc = run_experiment(parse_spec(BENCH_SPEC, "small.toml"))
    assert doc.complete is True
    engines, peers = doc.rows(), doc.rows(peers=True)
    assert [(r.engine, r.placement, r.status) for r in engines] == \
        [("epoll", "same", "ok"), ("epoll", "split", "ok")]
    for r in engines:
        assert (r.gbps or 0) > 0
        # Per-CPU shares are the workers' own, over the measured interval, for the CPUs used.
        assert set(r.cpus or {}) == {str(r.rx_app_cpu), str(r.tx_app_cpu)}
    assert [(r.peer, r.placement, r.status) for r in peers] == \
        [("iperf3", "same", "ok"), ("iperf3", "split", "ok")]
    tables = experiment_tables(doc)
    grid, *mpstats, peer_table = tables
    assert grid.headers == ["placement", "epoll"]
    assert len(mpstats) == 2 and all(t.headers[0] == "CPU" for t in mpstats)
    assert any(n.startswith("application on CPU") for n in mpstats[1].notes)
    assert [row[0] for row in peer_table.rows] == ["iperf3", "iperf3"]
    assert all(row[-1].endswith("x") for row in peer_table.rows)


@pytest.mark.root
def test_private_flag_ab_refuses_a_nic_without_the_flag(no_leaks: None) -> None:
    """The flag A/B asks the real ethtool netlink family; a veth has no skb_tx_mpwqe."""
    import subprocess

    name = f"zctx{os.getpid()}"  # tests/leaks.py counts it as this test's
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", name + "p"],
                   check=True)
    try:
        spec = dataclasses.replace(builtin_spec("tx-mpwqe"), matrix={
            "mode": ["single"], "payload": [64], "burst": [32]})
        doc = run_experiment(spec, rig=ExperimentRig(ifname=name, remote="198.18.0.2:9"), repeat=1)
    finally:
        subprocess.run(["ip", "link", "del", name], check=True)
    assert [(r.variant, r.status) for r in doc.results] == \
        [("skb_tx_mpwqe=off", "unsupported"), ("skb_tx_mpwqe=on", "unsupported")]
    reason = doc.results[0].reason
    assert "skb_tx_mpwqe" in reason and name in reason, reason


def test_unwritable_json_fails_before_the_first_cell(tmp_path: Path) -> None:
    measured = []

    def measure(spec: Spec, cell: Cell, target: ExperimentRig) -> Measured:
        measured.append(cell)
        return Measured([ResultRow(gbps=1.0)])

    spec = builtin_spec(next(iter(["zcrx-refs"])))
    with pytest.raises(ZcnetError):
        for _ in iter_run(spec, json_path=tmp_path / "missing" / "r.json", measure=measure):
            pass
    assert measured == []  # no minutes of measuring thrown away at the first write
