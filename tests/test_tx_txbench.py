"""run_txbench and `zcnet txbench`: every mode into the sink in the other lab namespace, the JSON
envelope, and bad input / unreachable targets ending in clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from rich.console import Console

from zcnet.bench.records import ResultFile, read_file, to_json
from zcnet.bench.txbench import ALL_MODES, run_txbench
from zcnet.cli import main
from zcnet.cli.txbench import render, seed_lines
from zcnet.errors import UsageError, ZcnetError
from zcnet.lab import Lab
from zcnet.netns import in_netns
from zcnet.tx.hwcount import NO_COUNTERS, HwCounters
from zcnet.tx.sink import Sink

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

N = 640


@pytest.mark.root
def test_every_mode_reaches_the_lab_sink_intact(no_leaks) -> None:
    doc = _json(run_txbench(modes=ALL_MODES, packets=N, repeat=2))
    assert doc["kind"] == "txbench" and doc["env"]["lab"] is True
    assert doc["env"]["hw_counters"] == ("yes" if _has_hw() else NO_COUNTERS)
    for mode in ALL_MODES:
        rows = [r for r in doc["results"] if r["mode"] == mode]
        assert [r["repeat"] for r in rows] == [0, 1]
        for r in rows:
            assert r["status"] == "ok", r
            assert r["sent"] == r["received"] == N and r["drops"] == 0
            assert r["bad_payload"] == 0 and r["wrong_size"] == 0
            assert r["ns_per_pkt"] > 0 and r["mpps"] > 0
        total = 2 * N  # sequence numbers run on across repeats: each arrived exactly once
        assert sum(r["seq_sum"] for r in rows) == total * (total - 1) // 2
        assert doc["summary"][mode]["received"] == total
    assert doc["summary"]["single"]["vs_single"] == pytest.approx(1.0)


def _json(doc: ResultFile) -> Any:
    """The document as its JSON file holds it."""
    return json.loads(json.dumps(to_json(doc)))


def _has_hw() -> bool:
    hw = HwCounters.open()
    if hw is None:
        return False
    hw.close()
    return True


@pytest.mark.root
def test_payload_beyond_path_mtu_is_a_clear_error(no_leaks) -> None:
    with pytest.raises(UsageError, match="path MTU") as info:
        run_txbench(modes=("gso",), size=1473, packets=64, repeat=1)
    assert "1472" in str(info.value)


@pytest.mark.root
def test_ipv6_lab(no_leaks) -> None:
    doc = _json(run_txbench(modes=("mmsg",), packets=64, repeat=1, ipv6=True))
    row = doc["results"][0]
    assert row["received"] == 64 and row["bad_payload"] == 0


@pytest.mark.root
@pytest.mark.parametrize(("dst", "why"), [
    ("198.18.0.2:9", "nothing listens"),       # ICMP port unreachable -> ECONNREFUSED
    ("198.18.7.7:9", "cannot reach"),          # no route inside the namespace
])
def test_unreachable_target_fails_instead_of_hanging(no_leaks, dst: str, why: str) -> None:
    with Lab() as lab, in_netns(lab.ns_a), pytest.raises(ZcnetError, match=why):
        run_txbench(modes=("single",), dst=dst, duration=3.0, repeat=1)


@pytest.mark.parametrize("argv", [["--burst", "0"], ["--size", "-1"], ["--repeat", "0"],
                                  ["--mode", "bogus"], ["--sizes", "64,0"]])
def test_cli_rejects_bad_numbers(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["txbench", *argv])
    assert exc.value.code == 2
    assert "txbench" in capsys.readouterr().err


def test_cli_loopback_json(no_leaks, tmp_path, capsys) -> None:
    out = tmp_path / "tx.json"
    assert main(["txbench", "--loopback", "--packets", "256", "--repeat", "1",
                 "--mode", "single,gso", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "txbench" and {r["mode"] for r in doc["results"]} == {"single", "gso"}
    assert all(r["received"] == 256 for r in doc["results"])
    assert "TCP-only" in doc["not_measured"]["devmem"]
    text = capsys.readouterr().out
    assert "single -> gso" in text and "Packet rate" in text


def test_devmem_is_refused_saying_why(no_leaks, capsys) -> None:
    """devmem TX exists for TCP only: txbench (UDP) says so instead of measuring something else."""
    assert main(["txbench", "--loopback", "--mode", "single,devmem"]) == 2
    err = capsys.readouterr().err
    assert "txbench cannot measure devmem: devmem TX is TCP-only" in err
    assert "zcnet bench --tx devmem" in err


def test_gso_fallback_is_noted_in_the_results(no_leaks) -> None:
    doc = _json(run_txbench(modes=("gso",), lab=False, sizes=[64, 128], burst=8, packets=64,
                            repeat=1))
    row = doc["results"][0]
    assert row["fallback_packets"] == 64 and row["received"] == 64
    assert any("mixed sizes" in n for n in doc["summary"]["gso"]["notes"])


def test_dst_mode_sends_to_a_given_address(no_leaks) -> None:
    with Sink("127.0.0.1", (64,)) as sink:
        doc = _json(run_txbench(modes=("mmsg",), dst=f"127.0.0.1:{sink.port}", packets=320,
                                repeat=2))
        got = sink.snapshot(100)
    rows = doc["results"]
    assert all("received" not in r for r in rows)  # no sink of ours: nothing to claim
    assert sum(r["sent"] for r in rows) == got["received"] == 640
    assert doc["env"]["target"] == f"127.0.0.1:{sink.port}" and doc["env"]["lab"] is False


def test_table_shows_unsupported_modes_and_counters() -> None:
    stat = {"mean": 1.0, "stdev": 0.1}
    row = {"status": "ok", "mpps": stat, "ns_per_pkt": stat, "instructions_per_pkt": stat,
           "cycles_per_pkt": stat, "vs_single": 1.0, "sent": 10, "received": 9, "drops": 1,
           "bad_payload": 0, "wrong_size": 0, "fallback_packets": 0, "retries": 0, "notes": []}
    doc = {"env": {"hw_counters": "yes"},
           "results": [{"mode": "single", "payload": 64, "burst": 32}],
           "summary": {"single": row,
                       "uring": {"status": "unsupported", "reason": "io_uring disabled"}}}
    console = Console(width=200, record=True)
    console.print(render(read_file(doc)))
    text = console.export_text()
    assert "instr/pkt" in text and "unsupported: io_uring disabled" in text
    assert seed_lines(read_file(doc)) == []  # no batched mode ran: nothing to compare


def _garbled_sink(cmd: list[str], **kw: object) -> subprocess.Popen[str]:
    """A 'sink' that prints something other than its JSON port line, then lingers."""
    code = "print('Warning: not json', flush=True); import time; time.sleep(3600)"
    return subprocess.Popen([sys.executable, "-c", code], **kw)  # type: ignore[call-overload]


@pytest.mark.timeout(60)
def test_sink_start_failure_is_an_error_and_stops_the_process(no_leaks) -> None:
    """The sink lingers for an hour: waiting for it would hit the timeout; no_leaks checks
    that it was stopped."""
    with pytest.raises(ZcnetError, match="sink"):
        Sink("127.0.0.1", (64,), spawn=_garbled_sink)
