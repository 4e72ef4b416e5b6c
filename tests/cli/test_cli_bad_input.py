"""Issue 14, the CLI's part: user text printed literally, one range per quantity, figures that were
not measured shown as n/a, options checked before measuring, true hints, partial results on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from paths import FIXTURES, ROOT
from zcnet import quantities
from zcnet.bench.client import ClientResult
from zcnet.bench.cpustat import shares
from zcnet.bench.records import (
    ClientSummary,
    CpuShares,
    Env,
    ResultFile,
    ResultRow,
    RoleShares,
    read_file,
)
from zcnet.bench.run import flow_cell
from zcnet.bench.spec import SpecError, builtin_text, parse_spec, tomllib
from zcnet.cli import build_parser, main, parse_args
from zcnet.cli.bench import print_report
from zcnet.cli.txbench import render
from zcnet.report.bench_table import bench_notes, cell_text

ZCNET = [sys.executable, "-m", "zcnet"]
FIX = FIXTURES
NASTY = "[/] [bold]x[/bold] [red] $1$ \\[ 50%"
LO_MTU = Path("/sys/class/net/lo/mtu").read_text().strip()


def zcnet(*args: str, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ZCNET, *args], capture_output=True, text=True, timeout=timeout, **kw)


def _doc(name: str) -> dict[str, Any]:
    return json.loads((FIX / name).read_text())


def _write(tmp_path: Path, name: str, doc: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


# --- user text is printed literally ----------------------------------------------------------


def test_markup_in_a_result_title_is_printed_and_files_are_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc("tx-mpwqe.json")
    doc["experiment"]["title"] = NASTY
    doc["results"][0]["reason"] = NASTY
    src = _write(tmp_path, "nasty.json", doc)
    csv, md = tmp_path / "out.csv", tmp_path / "out.md"
    assert main(["run", "--report", src, "--csv", str(csv), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert NASTY in out
    assert csv.read_text().startswith("mode,") and NASTY in md.read_text()


@pytest.mark.root
def test_spec_title_with_markup_runs_to_the_end(tmp_path: Path, no_leaks: None) -> None:
    """The reported crash: a full run whose title holds ``[/]``, then no CSV/MD at all."""
    text = builtin_text("tx-mpwqe")
    text = text.replace('title = "UDP single stream, burst 32: one packet per send vs batched '
                        'sends"', f'title = "{NASTY.replace(chr(92), chr(92) * 2)}"')
    text = text.replace("duration = 1.0", "duration = 0.05").replace("repeat = 5", "repeat = 1")
    text = text.replace('mode = ["single", "mmsg", "uring", "gso"]', 'mode = ["single"]')
    spec = tmp_path / "nasty.toml"
    spec.write_text(text)
    assert parse_spec(text).title == NASTY
    out = tmp_path / "out"
    r = zcnet("run", str(spec), "--out", str(out), timeout=180)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and NASTY in r.stdout
    assert {p.suffix for p in out.iterdir()} >= {".json", ".csv", ".md"}


def test_newlines_in_user_text_keep_markdown_tables_whole(tmp_path: Path) -> None:
    doc = _doc("zcrx-refs.json")
    doc["experiment"]["title"] = "two\nlines | and a bar"
    doc["results"][0]["status"], doc["results"][0]["reason"] = "unsupported", "a\nb"
    md = tmp_path / "t.md"
    assert main(["run", "--report", _write(tmp_path, "t.json", doc), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "### two lines \\| and a bar" in text
    for line in text.splitlines():
        assert not line or line.startswith(("#", "|", "-")), line


def test_outputs_onto_a_fifo_or_device_are_written_through(tmp_path: Path) -> None:
    """A rename over ``/dev/null`` would replace the device itself (as root): write in place."""
    import stat
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["run", "--report", str(FIX / "tx-mpwqe.json"), "--csv", str(fifo)]) == 0
    reader.join(10)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and got[0].startswith(b"mode,")
    if os.geteuid() == 0:
        null = tmp_path / "null"
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        rc = main(["compare", str(FIX / "bench-a.json"), str(FIX / "bench-b.json"),
                   "--json", str(null), "--markdown", str(null)])
        assert rc == 0 and stat.S_ISCHR(null.stat().st_mode)
    assert not list(tmp_path.glob(".*tmp"))


def test_hint_in_brackets_is_printed_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # plots unavailable: a hint is printed
    assert main(["run", "--report", str(FIX / "tx-mpwqe.json"), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "plots skipped" in out and "pip install matplotlib" in out


def test_bench_reasons_and_titles_are_literal() -> None:
    results = [{"engine": "epoll", "mtu": 1500, "placement": NASTY, "status": "unsupported",
                "reason": NASTY},
               {"engine": "uring", "mtu": 1500, "placement": NASTY, "status": "ok", "gbps": 1.0,
                "cpu": {"rx": {"busy": 50.0}}, "warning": NASTY,
                "verify": {"mismatches": 1, "checked_bytes": 9}}]
    doc = read_file({"env": {"lab": False, "target": {"note": NASTY}}, "results": results})
    buf = io.StringIO()
    print_report(doc, Console(file=buf, width=300))
    text = buf.getvalue()
    assert text.count(NASTY) >= 3 and "MISMATCH" in text
    txdoc = {"env": {}, "results": [], "summary": {"single": {"status": "unsupported",
                                                              "reason": NASTY}}}
    buf = io.StringIO()
    Console(file=buf, width=300).print(render(read_file(txdoc)))
    assert NASTY in buf.getvalue()


# --- one range per quantity --------------------------------------------------------------------

# (argv before the option, option, quantity): every numeric option of every command.
NUMERIC_OPTIONS = [
    (["bench"], "--duration", "duration"), (["bench"], "--queue", "queue"),
    (["bench"], "--mtu", "mtu"),
    (["txbench"], "--size", "payload"), (["txbench"], "--burst", "burst"),
    (["txbench"], "--duration", "duration"), (["txbench"], "--packets", "packets"),
    (["txbench"], "--repeat", "repeat"), (["txbench"], "--mtu", "mtu"),
    (["txbench"], "--sizes", "payload"),
    (["run"], "--repeat", "repeat"), (["run"], "--duration", "duration"),
    (["run"], "--queue", "queue"), (["run"], "--data-port", "port"),
    (["reproduce"], "--duration", "duration"),
    (["client"], "-n", "flows"), (["client"], "-t", "duration"),
    (["client"], "--data-port", "port"), (["client"], "--cpu-min", "cpu"),
    (["client"], "--pin-off", "cpu"), (["client"], "--rx-app-cpu", "cpu"),
    (["client"], "--max-attempts", "attempts"), (["client"], "--ssh-port", "port"),
    (["client"], "--read-size", "buffer"),
    (["server"], "--session-timeout", "timeout"), (["server"], "--max-flows", "flows"),
    (["server"], "--max-duration", "duration"), (["server"], "--max-memory", "memory"),
    (["lab", "up"], "--mtu", "mtu"),
    (["nic", "doctor", "lo"], "--queue", "queue"), (["nic", "doctor", "lo"], "--queues", "queue"),
    (["nic", "setup", "lo", "--queue", "1"], "--port", "port"),
]

NONSENSE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1", "-0.5", "1e30",
            str(10**40), "", " ", "abc", "0x10", "1,", "--"]


def _parse(argv: list[str]) -> tuple[Any, str]:
    """(namespace or the SystemExit code, stderr) of parsing argv in-process."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return parse_args(build_parser(), argv), err.getvalue()
        except SystemExit as exc:
            return exc.code, err.getvalue()


def _dest(option: str) -> str:
    return {"-n": "flows", "-t": "duration"}.get(option, option.lstrip("-").replace("-", "_"))


def _check(prefix: list[str], option: str, qty: str, text: str) -> None:
    result, err = _parse([*prefix, f"{option}={text}"])
    assert "Traceback" not in err
    if isinstance(result, int):
        assert result == 2 and option.lstrip("-")[:3] in err, err
        return
    value = getattr(result, _dest(option))
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        assert isinstance(v, (int, float)) and math.isfinite(v)
        assert quantities.problem(qty, v) is None


@pytest.mark.parametrize(("prefix", "option", "qty"), NUMERIC_OPTIONS)
def test_nonsense_numbers_are_usage_errors(prefix: list[str], option: str, qty: str) -> None:
    q = quantities.QUANTITIES[qty]
    for text in [*NONSENSE, str(q.min - 1), str(q.max * 2 + 1)]:
        result, err = _parse([*prefix, f"{option}={text}"])
        assert result == 2, (text, result)
        assert "Traceback" not in err and "error:" in err
    for good in (q.min, q.max):
        _check(prefix, option, qty, str(int(good) if q.kind is int else good))
        assert not isinstance(_parse([*prefix, f"{option}={good if q.kind is float else int(good)}"
                                      ])[0], int)


_number_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(NONSENSE),
    st.text(alphabet="0123456789.eE+-naif", max_size=8),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(NUMERIC_OPTIONS), text=_number_text)
def test_fuzz_numeric_options(case: tuple[list[str], str, str], text: str) -> None:
    prefix, option, qty = case
    _check(prefix, option, qty, text)


@pytest.mark.parametrize("argv", [
    ["bench", "--duration", "nan"], ["bench", "--duration", "inf"],
    ["txbench", "--duration", "inf", "--loopback"], ["txbench", "--burst", "1e400"],
    ["server", "--max-duration", "inf"], ["client", "-t", "nan"],
    ["run", "--repeat", "0"], ["lab", "up", "--mtu", "-1"],
])
def test_nonsense_numbers_in_a_subprocess(argv: list[str]) -> None:
    r = zcnet(*argv, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error" in r.stderr


def test_mtu_has_one_range_in_options_and_specs() -> None:
    q = quantities.QUANTITIES["mtu"]
    text = builtin_text("mlx5-zcrx")
    for mtu, ok in ((q.min, True), (q.max, True), (q.min - 1, False), (q.max + 1, False)):
        spec_text = text.replace("mtu = [1500, 4096, 9000]", f"mtu = [{int(mtu)}]")
        if ok:
            parse_spec(spec_text)
        else:
            with pytest.raises(SpecError, match=q.range_text().split(" ")[0]):
                parse_spec(spec_text)
        for prefix in (["bench"], ["txbench"], ["lab", "up"]):
            result, err = _parse([*prefix, "--mtu", str(int(mtu))])
            assert (not isinstance(result, int)) is ok, (prefix, mtu, err)
            if not ok:
                assert q.range_text().split(" ")[0] in err


@pytest.mark.parametrize(("key", "value"), [("duration", "inf"), ("duration", "nan"),
                                            ("duration", "1e9"), ("repeat", "100000")])
def test_spec_numbers_are_checked(key: str, value: str) -> None:
    text = builtin_text("tx-mpwqe")
    text = text.replace("duration = 1.0" if key == "duration" else "repeat = 5",
                        f"{key} = {value}")
    with pytest.raises(SpecError, match=f"run.{key}"):
        parse_spec(text)


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1.74])
def test_compare_refuses_non_finite_and_negative_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: float) -> None:
    a = _doc("bench-a.json")
    b = copy.deepcopy(a)
    row = next(r for r in b["results"] if r.get("status") == "ok")
    row["gbps"] = bad
    rc = main(["compare", _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b)])
    err = capsys.readouterr().err
    assert rc == 2 and "gbps" in err and "Traceback" not in err
    assert main(["run", "--report", str(tmp_path / "b.json")]) == 2


@pytest.mark.parametrize(("field", "value"), [("mtu", "abc"), ("mtu", math.nan), ("burst", -3),
                                              ("cpus", {"x": {}}), ("cpus", {"0": {"idle": 101}})])
def test_report_refuses_damaged_key_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           field: str, value: Any) -> None:
    doc = _doc("tx-mpwqe.json")
    doc["results"][0][field] = value
    assert main(["run", "--report", _write(tmp_path, "d.json", doc), "--plots",
                 str(tmp_path / "png")]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err
    assert not (tmp_path / "png").exists()


def test_compare_says_different_kinds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _doc("bench-a.json"), _doc("tx-mpwqe.json")
    b["env"] = a["env"]
    rc = main(["compare", _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b)])
    err = capsys.readouterr().err
    assert rc == 2 and "different kinds" in err


@pytest.mark.parametrize("argv", [["--burst", "32769"], ["--burst", "100000"]])
def test_burst_beyond_io_uring_names_the_real_limit(argv: list[str]) -> None:
    result, err = _parse(["txbench", "--loopback", *argv])
    assert result == 2 and "32768" in err and "io_uring" in err and "unavailable" not in err


def test_largest_burst_runs_on_io_uring(no_leaks: None) -> None:
    from zcnet.bench.txbench import run_txbench

    doc = run_txbench(modes=["uring"], size=8, burst=quantities.IORING_MAX_ENTRIES,
                      packets=quantities.IORING_MAX_ENTRIES, repeat=1, lab=False)
    assert isinstance(doc.summary, dict) and doc.summary["uring"].status == "ok", doc.summary


# --- figures that were not measured ------------------------------------------------------------


def test_no_ticks_is_no_share_not_zero() -> None:
    assert shares(np.zeros(8, dtype=np.int64)) == CpuShares()


def _flow_result(cpus: dict[str, dict[str, RoleShares]], incoming: int) -> ClientResult:
    flow = ResultRow(bytes=10, seconds=1.0, gbps=1.0, rx_app_cpu=1, tx_app_cpu=0, rx_cpu=0,
                     tx_cpu=0, rx_cpu_end=incoming)
    return ClientResult([flow], ClientSummary(flows=1, ok=1, mode="stream"), cpus, {})


SAMPLED = RoleShares(usr=1.0, sys=1.0, irq=0.0, soft=0.0, idle=98.0, busy=2.0)


def _in_a_lab(*rows: ResultRow) -> ResultFile:
    return ResultFile(env=Env(lab=True), results=list(rows))


def test_unsampled_cpu_share_is_na_not_zero_percent() -> None:
    r = _flow_result({"dst": {"0": SAMPLED}, "src": {"0": SAMPLED}}, incoming=0)  # no CPU 1
    cell = flow_cell(r, 1500, "epoll", "split", tx="copy", consumer="same")
    assert cell.cpu is not None and cell.cpu.rx is None
    assert cell.cpu.tx is not None and cell.cpu.tx.busy == 2.0
    assert "rx CPU 1" in (cell.cpu_reason or "")
    assert "0%" not in cell_text(cell).plain and "n/a" in cell_text(cell).plain
    notes = bench_notes(_in_a_lab(cell))
    assert any("not sampled" in n for n in notes)


def test_split_cell_with_softirq_on_the_app_cpu_warns() -> None:
    r = _flow_result({"dst": {"1": SAMPLED}, "src": {"0": SAMPLED}}, incoming=1)
    cell = flow_cell(r, 1500, "epoll", "split", tx="copy", consumer="same")
    assert "application's CPU 1" in cell.warnings[0]
    assert any(n.startswith("warning:") for n in bench_notes(_in_a_lab(cell)))
    r = _flow_result({"dst": {"1": SAMPLED}, "src": {"0": SAMPLED}}, incoming=0)
    assert flow_cell(r, 1500, "epoll", "split", tx="copy", consumer="same").warnings == []


def test_experiment_tables_show_warnings_and_unsampled_cpu() -> None:
    from zcnet.report.tables import experiment_tables

    doc = _doc("mlx5-zcrx.json")
    first = next(r for r in doc["results"] if r.get("status") == "ok" and not r.get("peer"))
    for row in doc["results"]:  # every repeat of that cell
        if (row.get("engine"), row.get("mtu")) == (first["engine"], first["mtu"]):
            for key in ("cpu", "cpus", "rx_busy"):
                row.pop(key, None)
    first["warning"] = "receive softirq ran on the application's CPU 1"
    text = "\n".join(" ".join(r) for t in experiment_tables(read_file(doc)) for r in t.rows)
    notes = [n for t in experiment_tables(read_file(doc)) for n in t.notes]
    assert "n/a CPU" in text and "0% CPU" not in text
    assert any(n.startswith("warning:") and "application's CPU 1" in n for n in notes)


@pytest.mark.root
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_pinned_application_cpu_is_always_sampled(no_leaks: None) -> None:
    """Once a worker exited, its affinity could no longer be read and its CPU went unsampled
    (about 1 in 9 lab cells read "(0%)"): the server keeps the CPU it pinned."""
    from zcnet.bench.client import ClientOptions, lab_servers, run
    from zcnet.lab import Lab

    rx, tx = sorted(os.sched_getaffinity(0))[:2][::-1]
    with Lab() as lab, lab_servers(lab) as ls:
        for _ in range(12):
            r = run(ls.options(ClientOptions(duration=0.05, rx_app_cpu=rx, tx_app_cpu=tx)))
            assert r.flows[0].status == "ok"
            assert str(rx) in r.cpus["dst"] and str(tx) in r.cpus["src"], r.cpus


# --- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["bench", "--engine", "epoll,epoll"], ["bench", "--mtu", "1500,1500"],
    ["bench", "--placement", "same,same"], ["bench", "--peers", "iperf3,iperf3"],
    ["bench", "--engine", ""], ["bench", "--engine", ","], ["bench", "--mtu", "1500,"],
    ["txbench", "--mode", "single,single"], ["txbench", "--mode", ""],
    ["txbench", "--sizes", ""], ["txbench", "--sizes", "64,,64"],
    ["bench", "--tx", "warp"], ["txbench", "--dst", "1.2.3.4:5", "--loopback"],
])
def test_bad_lists_are_usage_errors(argv: list[str]) -> None:
    result, err = _parse(argv)
    assert result == 2 and "Traceback" not in err


def test_repeated_sizes_are_a_pattern_not_an_error() -> None:
    ns, _ = _parse(["txbench", "--sizes", "64,64,128"])
    assert ns.sizes == (64, 64, 128)


@pytest.mark.parametrize("argv", [
    ["bench", "--no-lab", "--json", "{tmp}/missing/x.json"],
    ["bench", "--no-lab", "--json", "{tmp}"],
    ["bench", "--no-lab", "--queue", "1"],
    ["txbench", "--loopback", "--json", "{tmp}/missing/x.json"],
    ["txbench", "--dst", "not-an-address"],
    ["txbench", "--loopback", "--packets", "4", "--burst", "8"],
    ["reproduce", "tx-mpwqe", "--queue", "1"],
    ["reproduce", "tx-mpwqe", "--data-port", "9000"],
    ["reproduce", "tx-mpwqe", "--token-file", "/nonexistent"],
    ["reproduce", "tx-mpwqe", "--out", "{tmp}/file"],
    ["reproduce", "tx-mpwqe", "--csv", "{tmp}/missing/x.csv"],
    ["run", "--report", str(FIX / "tx-mpwqe.json"), "--markdown", "{tmp}"],
    ["compare", str(FIX / "bench-a.json"), str(FIX / "bench-b.json"), "--csv", "{tmp}/no/x"],
    ["reproduce", "mlx5-zcrx", "--ifname", "../../etc"],
    ["reproduce", "mlx5-zcrx", "--ifname", "nosuch0", "--remote", "198.18.0.9"],
    ["bench", "--ifname", "nosuch0", "--queue", "1"],
    ["bench", "--no-lab", "--peers", "iperf3"],
    # Permissions say yes to root here, the kernel says no: found before, not after, measuring.
    ["txbench", "--loopback", "--json", "/proc/zcnet-test.json"],
    ["reproduce", "tx-mpwqe", "--markdown", "/proc/zcnet-test.md"],
])
def test_options_are_checked_before_measuring(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "file").write_text("")
    argv = [a.format(tmp=tmp_path) for a in argv]
    t0 = time.monotonic()
    r = zcnet(*argv, "--duration", "60", timeout=60) if argv[0] in ("bench", "txbench") \
        else zcnet(*argv, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "error" in r.stderr
    assert time.monotonic() - t0 < 30  # no 60 s cell started
    assert not [p for p in tmp_path.rglob("*") if p.name != "file"]


# --- hints -------------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="the hint for root is what is checked")
def test_loopback_cell_hint_to_root_is_not_run_as_root(tmp_path: Path) -> None:
    out = tmp_path / "lo.json"
    r = zcnet("bench", "--no-lab", "--mtu", "1500", "--engine", "epoll", "--placement", "same",
              "--duration", "0.1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    reason = json.loads(out.read_text())["results"][0]["reason"]
    assert "run as root" not in reason and "leave out --no-lab" in reason


@pytest.mark.root
@pytest.mark.parametrize(("argv", "around", "wrong"), [
    (["txbench", "--duration", "0.1"], "--loopback", "--no-lab"),
    (["bench", "--lab", "--duration", "0.1"], "--no-lab", "--loopback"),
    (["lab", "up"], None, "--no-lab"),
])
def test_privilege_hint_names_this_commands_way_around(argv: list[str], around: str | None,
                                                       wrong: str) -> None:
    setpriv = "/usr/bin/setpriv"
    if not os.path.exists(setpriv):
        pytest.skip("setpriv (util-linux) not installed")
    r = subprocess.run([setpriv, "--bounding-set=-net_admin,-sys_admin", *ZCNET, *argv],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    fix = next(line for line in r.stderr.splitlines() if line.startswith("zcnet: fix:"))
    assert "run as root" not in fix  # said to root, who lacks capabilities, not identity
    assert wrong not in fix
    if around:
        assert around in fix


# --- partial results -------------------------------------------------------------------------


def _interrupt_after(p: subprocess.Popen[str], seconds: float) -> tuple[str, str]:
    time.sleep(seconds)
    p.send_signal(signal.SIGINT)
    return p.communicate(timeout=60)


def _wait_for_results(out: Path, timeout: float = 60) -> None:
    """Until the run's JSON holds a measured row (or ``timeout`` passes: the test then sees
    what the run wrote)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(out.read_text())["results"]:
                return
        time.sleep(0.1)


def test_txbench_ctrl_c_writes_what_was_measured(tmp_path: Path, no_leaks: None) -> None:
    out = tmp_path / "tx.json"
    p = subprocess.Popen([*ZCNET, "txbench", "--loopback", "--mode", "single,mmsg",
                          "--duration", "0.2", "--repeat", "1000", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = _interrupt_after(p, 10.0)  # start-up (the sink process) takes a while
    assert p.returncode == 130 and "Traceback" not in stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["results"]
    assert all(r["status"] == "ok" for r in doc["results"])
    assert "incomplete" in stdout and "Mpps" in stdout


def test_bench_ctrl_c_keeps_cells_marked_incomplete(tmp_path: Path, no_leaks: None) -> None:
    out = tmp_path / "b.json"
    p = subprocess.Popen([*ZCNET, "bench", "--no-lab", "--mtu", LO_MTU, "--engine",
                          "epoll,uring,uring-mshot,soft-zc", "--placement", "same",
                          "--duration", "1", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_results(out)
    stdout, stderr = _interrupt_after(p, 0.2)
    assert p.returncode == 130 and "Traceback" not in stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and 1 <= len(doc["results"]) < 4
    assert "incomplete" in stdout


@pytest.mark.root
def test_run_ctrl_c_writes_every_report_marked_incomplete(tmp_path: Path,
                                                          no_leaks: None) -> None:
    text = builtin_text("tx-mpwqe").replace("duration = 1.0", "duration = 0.1")
    spec = tmp_path / "long.toml"
    spec.write_text(text.replace("repeat = 5", "repeat = 200"))
    out = tmp_path / "out"
    p = subprocess.Popen([*ZCNET, "run", str(spec), "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if len(json.loads((out / "tx-mpwqe.json").read_text())["results"]) >= 2:
                break
        time.sleep(0.1)
    stdout, stderr = _interrupt_after(p, 0.1)
    assert p.returncode == 130 and "Traceback" not in stderr
    doc = json.loads((out / "tx-mpwqe.json").read_text())
    assert doc["complete"] is False and doc["results"]
    assert "incomplete" in (out / "tx-mpwqe.md").read_text()
    assert (out / "tx-mpwqe.csv").read_text().startswith("mode,")
    assert "incomplete" in stdout


def test_reports_mark_incomplete_results(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc("tx-mpwqe.json")
    doc["complete"] = False
    doc["results"] = doc["results"][:3]
    src = _write(tmp_path, "partial.json", doc)
    md = tmp_path / "p.md"
    assert main(["run", "--report", src, "--markdown", str(md)]) == 0
    assert "incomplete" in capsys.readouterr().out and "incomplete" in md.read_text()
    full = _doc("tx-mpwqe.json")
    full["env"] = doc["env"]
    assert main(["compare", _write(tmp_path, "full.json", full), src]) == 0
    assert "incomplete: B" in capsys.readouterr().out


def test_plots_are_a_default_dependency() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(d.startswith("matplotlib") for d in deps["project"]["dependencies"])


_junk = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1, -0.5, 10**30, 1e300]),
                  st.text(max_size=6), st.none(), st.lists(st.integers(), max_size=2),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                  st.booleans(), st.integers(), st.floats())


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["bench-a.json", "tx-mpwqe.json", "zcrx-refs.json"]),
       data=st.data())
def test_fuzz_result_files(tmp_path: Path, name: str, data: st.DataObject) -> None:
    """Damaged result files are a usage error or a report, never a traceback."""
    doc = _doc(name)
    where = data.draw(st.sampled_from(["row", "row", "report", "experiment", "env", "top"]))
    if where == "row":
        target = data.draw(st.sampled_from(doc["results"]))
        fields = [*target, "gbps", "mpps", "mtu"]
    elif where == "top":
        target, fields = doc, ["env", "experiment", "report", "complete", "kind"]
    else:
        target = doc.setdefault(where, {})
        fields = [*target, "metric", "extra", "baseline", "title", "substitutions", "nic"]
    target[data.draw(st.sampled_from(fields))] = data.draw(_junk)
    path = _write(tmp_path, "fuzz.json", doc)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc_report = main(["run", "--report", path])
        rc_compare = main(["compare", str(FIX / name), path])
    assert rc_report in (0, 1, 2) and rc_compare in (0, 1, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()


_toml_junk = st.sampled_from(["nan", "inf", "-inf", "+inf", "-1", "0", "0.0", "1e308", "1e-9",
                              "99999999999", '"x"', '"[/]"', "[]", "[nan]", "[inf, 1500]",
                              "[0]", "[-1500]", "[1500, 1500]", "{}", "true", "2.5", "[2.5]"])


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["mlx5-zcrx", "tx-mpwqe", "zcrx-refs"]), data=st.data())
def test_fuzz_spec_numbers(name: str, data: st.DataObject) -> None:
    """Any value in any key of a spec: a SpecError naming it, or a spec whose numbers are valid."""
    lines = builtin_text(name).splitlines()
    keyed = [i for i, line in enumerate(lines) if " = " in line and not line.startswith("#")]
    i = data.draw(st.sampled_from(keyed))
    key = lines[i].split(" = ", 1)[0]
    lines[i] = f"{key} = {data.draw(_toml_junk)}"
    try:
        spec = parse_spec("\n".join(lines) + "\n", "fuzz.toml")
    except SpecError as exc:
        assert exc.message.startswith("fuzz.toml")
        return
    assert quantities.problem("duration", spec.duration) is None
    assert quantities.problem("repeat", spec.repeat) is None
    for axis, qty in (("mtu", "mtu"), ("payload", "payload"), ("burst", "burst")):
        for v in spec.matrix.get(axis, []):
            assert quantities.problem(qty, v) is None
