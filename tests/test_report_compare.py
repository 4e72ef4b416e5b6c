"""`zcnet compare`: per-cell verdicts on recorded runs, and refusal across different systems."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from report_docs import FIX
from zcnet.cli import main
from zcnet.errors import ZcnetError
from zcnet.report.compare import compare, key_text


def load(name: str) -> dict[str, Any]:
    return json.loads((FIX / name).read_text())


def by_cell(rows: list[Any]) -> dict[str, Any]:
    return {key_text(r.key): r for r in rows}


def test_per_cell_ratio_and_verdict() -> None:
    rows = by_cell(compare(load("bench-a.json"), load("bench-b.json")))
    uring = rows["engine=uring placement=split mtu=1500"]
    assert uring.metric == "gbps"
    assert uring.a.mean == pytest.approx(12.0)
    assert uring.b.mean == pytest.approx(14.9)
    assert uring.verdict.ratio == pytest.approx(14.9 / 12.0)
    assert uring.verdict.text() == "1.24x faster, significant"
    epoll = rows["engine=epoll placement=split mtu=1500"]
    assert epoll.verdict.text() == "not significant"
    # A cell neither run could measure says why instead of inventing a ratio.
    zcrx = rows["engine=zcrx placement=split mtu=1500"]
    assert zcrx.verdict is None
    assert zcrx.note.startswith("both unsupported (device lacks queue management ops")


def test_reversed_order_reads_slower() -> None:
    rows = by_cell(compare(load("bench-b.json"), load("bench-a.json")))
    assert rows["engine=uring placement=split mtu=1500"].verdict.text() == \
        "1.24x slower, significant"


def test_cells_only_on_one_side() -> None:
    b = load("bench-b.json")
    b["results"] = [r for r in b["results"] if r["engine"] != "epoll"]
    rows = by_cell(compare(load("bench-a.json"), b))
    assert rows["engine=epoll placement=split mtu=1500"].note == "only in A"


VETH = {"ifname": "zc1x1b", "driver": "veth", "firmware": "", "bus_info": ""}
MLX5 = {"ifname": "eth2", "driver": "mlx5_core", "firmware": "28.39.1002",
        "bus_info": "0000:08:00.0"}


@pytest.mark.parametrize(("field", "value"), [
    ("kernel", "6.1.0-18-amd64"),
    ("cpu_model", "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz"),
    ("nic", MLX5),
])
def test_refuses_different_systems_unless_forced(field: str, value: Any) -> None:
    a = copy.deepcopy(load("bench-a.json"))
    a["env"]["nic"] = VETH
    b = copy.deepcopy(load("bench-b.json"))
    b["env"]["nic"] = VETH
    b["env"][field] = value
    with pytest.raises(ZcnetError) as info:
        compare(a, b)
    assert field in info.value.message
    assert "--force" in (info.value.hint or "")
    assert compare(a, b, force=True)


def test_same_nic_under_another_name_is_comparable() -> None:
    # Every lab gets a fresh veth name; the driver, firmware and bus address are the identity.
    a, b = copy.deepcopy(load("bench-a.json")), copy.deepcopy(load("bench-b.json"))
    a["env"]["nic"] = VETH
    b["env"]["nic"] = {**VETH, "ifname": "zc2x1b", "rings": {"rx": 1024}}
    assert compare(a, b)
    # A NIC recorded on one side only is unknown there, not different.
    del a["env"]["nic"]
    assert compare(a, b)


def test_cli_refusal_is_one_line_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", str(FIX / "bench-a.json"), str(FIX / "bench-other-host.json")])
    err = capsys.readouterr().err
    assert rc == 1
    assert "Traceback" not in err
    assert err.splitlines()[0].startswith("zcnet: error: runs were measured on different systems")


def test_cli_writes_json_csv_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = {k: tmp_path / f"c.{k}" for k in ("json", "csv", "md")}
    rc = main(["compare", str(FIX / "bench-a.json"), str(FIX / "bench-b.json"),
               "--json", str(out["json"]), "--csv", str(out["csv"]),
               "--markdown", str(out["md"])])
    assert rc == 0
    assert "1.24x faster, significant" in capsys.readouterr().out
    doc = json.loads(out["json"].read_text())
    assert doc["kind"] == "compare"
    verdicts = {r["cell_text"]: r["verdict"] for r in doc["results"]}
    assert verdicts["engine=uring placement=split mtu=1500"] == "1.24x faster, significant"
    csv_lines = out["csv"].read_text().splitlines()
    assert csv_lines[0].startswith("cell,metric,a_mean")
    assert len(csv_lines) == 1 + 3
    assert "| engine=uring placement=split mtu=1500 | gbps |" in out["md"].read_text()


def test_cli_rejects_non_result_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    assert main(["compare", str(junk), str(FIX / "bench-a.json")]) == 2
    assert "not a zcnet result file" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--csv", "--markdown", "--json"])
def test_compare_to_a_missing_directory_is_an_error_not_a_traceback(
        tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "out"
    rc = main(["compare", str(FIX / "bench-a.json"), str(FIX / "bench-b.json"), option,
               str(target)])
    assert rc != 0
    err = capsys.readouterr().err
    assert "zcnet: error:" in err and str(target) in err
