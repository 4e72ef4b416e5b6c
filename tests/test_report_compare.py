"""`zcnet compare`: per-cell verdicts on recorded runs, and refusal across different systems."""

from __future__ import annotations

import copy
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from report_docs import ENGINES, FIX, bench_rows, record
from zcnet.cli import main
from zcnet.errors import ZcnetError
from zcnet.report.compare import compare, key_text


def load(name: str) -> dict[str, Any]:
    return json.loads((FIX / name).read_text())


def by_cell(rows: list[Any]) -> dict[str, Any]:
    return {key_text(r.key): r for r in rows}


def test_per_cell_ratio_and_verdict() -> None:
    rows = by_cell(compare(record(load("bench-a.json")), record(load("bench-b.json"))))
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
    rows = by_cell(compare(record(load("bench-b.json")), record(load("bench-a.json"))))
    assert rows["engine=uring placement=split mtu=1500"].verdict.text() == \
        "1.24x slower, significant"


def test_cells_only_on_one_side() -> None:
    b = load("bench-b.json")
    b["results"] = [r for r in b["results"] if r["engine"] != "epoll"]
    rows = by_cell(compare(record(load("bench-a.json")), record(b)))
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
        compare(record(a), record(b))
    assert field in info.value.message
    assert "--force" in (info.value.hint or "")
    assert compare(record(a), record(b), force=True)


def test_same_nic_under_another_name_is_comparable() -> None:
    # Every lab gets a fresh veth name; the driver, firmware and bus address are the identity.
    a, b = copy.deepcopy(load("bench-a.json")), copy.deepcopy(load("bench-b.json"))
    a["env"]["nic"] = VETH
    b["env"]["nic"] = {**VETH, "ifname": "zc2x1b", "rings": {"rx": 1024}}
    assert compare(record(a), record(b))
    # A NIC recorded on one side only is unknown there, not different.
    del a["env"]["nic"]
    assert compare(record(a), record(b))


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
    table = capsys.readouterr().out
    assert re.search(r"uring +12\.00 ± 0\.16 +14\.90 ± 0\.16 +1\.24x +faster p<0\.001", table)
    assert "not measured: zcrx: both unsupported (device lacks queue" in table
    doc = json.loads(out["json"].read_text())
    assert doc["kind"] == "compare"
    verdicts = {r["cell_text"]: r["verdict"] for r in doc["results"]}
    assert verdicts["engine=uring placement=split mtu=1500"] == "1.24x faster, significant"
    csv_lines = out["csv"].read_text().splitlines()
    assert csv_lines[0].startswith("cell,metric,a_mean")
    assert len(csv_lines) == 1 + 3
    assert "| uring | 12.00 ± 0.16 | 14.90 ± 0.16 | 1.24x | faster p<0.001 |" in \
        out["md"].read_text()


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


# ---- readable at 80 columns --------------------------------------------------------------

def _run(gbps: float) -> dict[str, Any]:
    """A bench run as `zcnet bench --repeat 3` writes it: every engine, MTU and placement."""
    return {**load("bench-a.json"), "results": bench_rows(ENGINES, lambda rep, p, mtu, i, e: {
        "tx": "copy", "consumer": "same", "gbps": gbps + i + mtu / 1000 + rep / 10,
        "cpu": {"rx": {"busy": 99.0}}})}


def render(argv: list[str], width: int = 80) -> str:
    """`zcnet compare` as printed on a terminal of ``width`` columns."""
    import io

    from rich.console import Console

    from zcnet.cli import compare as cli_compare

    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False)
    real = cli_compare.make_console
    cli_compare.make_console = lambda **_: console  # type: ignore[assignment]
    try:
        assert main(["compare", *argv]) == 0
    finally:
        cli_compare.make_console = real  # type: ignore[assignment]
    return buf.getvalue()


def test_compare_of_a_full_run_reads_at_80_columns(tmp_path: Path) -> None:
    a, b = tmp_path / "before-the-change.json", tmp_path / "after-the-change.json"
    a.write_text(json.dumps(_run(10.0)))
    b.write_text(json.dumps(_run(10.5)))
    text = render([str(a), str(b)])
    long = [line for line in text.splitlines() if len(line.rstrip()) > 80]
    assert not long, "\n".join(long)
    # A row per measured cell, whole: its name, both means ± stdev, the ratio, the verdict.
    rows = [line for line in text.splitlines() if re.match(r"^(epoll|uring|soft-zc)", line)]
    assert len(rows) == 4 * 3 * 2
    for line in rows:
        assert re.fullmatch(r"(epoll|uring|uring-mshot|soft-zc) (same|split) (1500|4096|9000)"
                            r" +\d+\.\d\d ± \d\.\d\d +\d+\.\d\d ± \d\.\d\d +1\.\d\dx "
                            r"+(faster|slower|n\.s\.) p[=<]\d\.\d{3}", line.rstrip()), line
    assert "cell: engine placement mtu (all cells: tx copy, consumer same)" in text
    # Cells neither side measured: one note per reason, not a table of n/a.
    flat = " ".join(text.split())
    assert "not measured: zcrx same 1500, zcrx same 4096" in flat
    assert flat.count("not measured:") == 2


# ---- hostile files: one line, bounded time and memory ---------------------------------------

def _refused(capsys: pytest.CaptureFixture[str], *paths: str) -> str:
    rc = main(["compare", *paths])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    first, *rest = err.splitlines()
    assert first.startswith("zcnet: error: ") and rest and rest[0].startswith("zcnet: fix: ")
    return first


def test_deeply_nested_json_is_refused(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    for depth in (100, 200_000):  # under json's recursion limit, and far over it
        deep = tmp_path / f"deep{depth}.json"
        deep.write_text('{"tool": "zcnet", "results": [], "env": ' + "[" * depth + "]" * depth
                        + "}")
        assert "nests more than 32 levels" in _refused(capsys, str(deep), str(FIX /
                                                                              "bench-a.json"))


@pytest.mark.parametrize(("encoding", "needle"), [
    ("utf-16", "is UTF-16 text"), ("utf-32", "is UTF-32 text"), ("latin-1", "is not UTF-8"),
    ("utf-16-le", "binary or UTF-16/32 without a byte-order mark")])
def test_another_encoding_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   encoding: str, needle: str) -> None:
    doc = load("bench-a.json")
    doc["env"]["hostname"] = "hôte"  # latin-1 encodes this byte as 0xf4, not UTF-8
    f = tmp_path / "other.json"
    f.write_bytes(json.dumps(doc, ensure_ascii=False).encode(encoding))
    assert needle in _refused(capsys, str(FIX / "bench-a.json"), str(f))


def test_a_utf8_bom_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bom.json"
    f.write_bytes(b"\xef\xbb\xbf" + (FIX / "bench-b.json").read_bytes())
    assert main(["compare", str(FIX / "bench-a.json"), str(f)]) == 0


def test_device_files_that_never_end_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    refused = _refused(capsys, "/dev/zero", str(FIX / "bench-a.json"))
    assert "/dev/zero is a character device" in refused
    assert "is a directory" in _refused(capsys, str(FIX), str(FIX / "bench-a.json"))


def test_a_fifo_without_writer_does_not_hang(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    done = threading.Event()
    result: list[str] = []

    def run() -> None:
        result.append(_refused(capsys, str(fifo), str(FIX / "bench-a.json")))
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    # Opening a FIFO for reading blocks until a writer comes; the check must not wait for one.
    assert done.wait(10), "compare blocked on a FIFO"
    assert "is a FIFO" in result[0]


def test_a_huge_file_is_refused_before_it_is_read(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from zcnet.report.load import MAX_BYTES

    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: no disk, and not read
    assert "larger than 64 MiB" in _refused(capsys, str(big), str(FIX / "bench-a.json"))


def test_a_file_whose_size_lies_is_read_only_up_to_the_limit(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """/proc and /sys files say size 0 (or 4096) whatever they hold: reading stops at the
    limit all the same."""
    from zcnet.userfile import read_bytes

    with pytest.raises(ZcnetError, match="larger than 1000 bytes"):
        read_bytes("/proc/self/maps" if len(Path("/proc/self/maps").read_bytes()) > 1000
                   else "/proc/kallsyms", "result file", limit=1000, fix="")
    assert read_bytes("/proc/self/stat", "result file", limit=1000, fix="").startswith(
        str(os.getpid()).encode())


def test_huge_integers_are_an_error_not_a_traceback(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "digits.json"
    f.write_text('{"tool": "zcnet", "results": [], "n": ' + "9" * 5000 + "}")
    assert "not a result file" in _refused(capsys, str(f), str(FIX / "bench-a.json"))


def test_single_runs_say_why_there_is_no_verdict(tmp_path: Path) -> None:
    a = load("bench-a.json")
    a["results"] = [r for r in a["results"] if r.get("repeat", 0) == 0]
    f = tmp_path / "once.json"
    f.write_text(json.dumps(a))
    text = render([str(f), str(f)])
    assert re.search(r"^epoll .* 1\.00x +no verdict", text, re.M)
    assert "no verdict: a side ran the cell once; a t-test needs --repeat 2" in \
        " ".join(text.split())
