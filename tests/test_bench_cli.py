"""`zcnet bench` end to end: JSON envelope, bad arguments, n/a cells, dead peers, Ctrl-C cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from zcnet.bench.run import DEFAULT_ENGINES, BenchOptions, run_bench
from zcnet.lab import names
from zcnet.netns import list_netns

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

ZCNET = [sys.executable, "-m", "zcnet"]
CELL_KEYS = {"engine", "mtu", "placement", "status", "reason"}
OK_KEYS = CELL_KEYS | {"bytes", "seconds", "gbps", "cpu", "verify"}
CPU_KEYS = {"usr", "sys", "irq", "soft", "idle"}


def zcnet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ZCNET, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.root
def test_bench_json_envelope_with_verify(no_leaks, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = zcnet("bench", "--mtu", "9000", "--placement", "split", "--duration", "0.4", "--verify",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["tool"] == "zcnet" and doc["kind"] == "bench" and doc["version"]
    assert {"kernel", "cpus", "cpu_model", "python", "hot_path", "lab"} <= doc["env"].keys()
    assert doc["env"]["lab"] is True
    assert [c["engine"] for c in doc["results"]] == list(DEFAULT_ENGINES)
    zcrx = next(c for c in doc["results"] if c["engine"] == "zcrx")
    # No zcrx NIC here: the kernel's refusal for the lab's veth, translated, is the cell.
    assert zcrx["status"] == "unsupported"
    assert "queue management ops or header-data split" in zcrx["reason"]
    for cell in doc["results"]:
        if cell["engine"] == "zcrx":
            continue
        assert cell["status"] == "ok", cell
        assert cell.keys() >= OK_KEYS
        assert cell["cpu"]["rx"].keys() >= CPU_KEYS and cell["cpu"]["tx"].keys() >= CPU_KEYS
        assert cell["mtu"] == 9000 and cell["placement"] == "split"
        # The lab's receive is steered to the sender's CPU: the softirq ran there, every time.
        assert doc["env"]["target"]["rx_steer_cpu"] == cell["tx_app_cpu"] == cell["rx_cpu_end"]
        assert cell["rx_app_cpu"] != cell["tx_app_cpu"] and "warnings" not in cell
        # How much a 0.4 s cell moves depends on the machine's load: a speed, not a property.
        assert cell["bytes"] > 0 and cell["gbps"] > 0
        assert cell["verify"]["mismatches"] == 0
        assert cell["verify"]["checked_bytes"] == cell["bytes"]
    # The soft provider copies every byte (recv into its buffers): 0% zero-copy, said so.
    soft = next(c for c in doc["results"] if c["engine"] == "soft-zc")["engine_stats"]
    assert soft["kernel_copied_bytes"] == next(
        c["bytes"] for c in doc["results"] if c["engine"] == "soft-zc")
    assert soft["zero_copy_share"] == 0.0 and "zc 0%" in r.stdout
    # The table names every engine and the placement block, and says why zcrx is n/a.
    assert "uring-mshot" in r.stdout and "split" in r.stdout and "n/a" in r.stdout


@pytest.mark.root
def test_no_rx_steer_leaves_the_lab_as_veth_has_it(no_leaks, tmp_path: Path) -> None:
    out = tmp_path / "unsteered.json"
    r = zcnet("bench", "--no-rx-steer", "--mtu", "1500", "--engine", "epoll", "--placement",
              "split", "--duration", "0.3", "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["env"]["lab"] is True and doc["env"]["target"]["rx_steer_cpu"] is None
    assert doc["results"][0]["status"] == "ok"


@pytest.mark.parametrize(("args", "needle"), [
    (["--engine", "warp"], "epoll"),
    (["--placement", "middle"], "same, split"),
    (["--mtu", "70000"], "68..65536"),
    (["--mtu", "abc"], "not a whole number"),
    (["--duration", "0"], "0.01..3600"),
])
def test_bad_arguments_are_one_line_errors(args: list[str], needle: str) -> None:
    r = zcnet("bench", *args, timeout=30)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_loopback_fallback_marks_unsettable_mtu_na(no_leaks, tmp_path: Path) -> None:
    lo_mtu = int(Path("/sys/class/net/lo/mtu").read_text())
    out = tmp_path / "lo.json"
    r = zcnet("bench", "--no-lab", "--mtu", f"1500,{lo_mtu}", "--engine", "epoll",
              "--placement", "same", "--duration", "0.3", "--json", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["env"]["lab"] is False
    na, ok = doc["results"]
    assert na["status"] == "unsupported" and "MTU 1500" in na["reason"]
    assert ok["status"] == "ok" and ok["bytes"] > 0
    assert "n/a" in r.stdout


def test_split_placement_on_one_cpu_is_na_not_a_crash(tmp_path: Path) -> None:
    out = tmp_path / "one.json"
    r = subprocess.run(["taskset", "-c", "0", *ZCNET, "bench", "--no-lab", "--mtu",
                        Path("/sys/class/net/lo/mtu").read_text().strip(), "--engine", "epoll",
                        "--placement", "split", "--duration", "0.2", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    cell = json.loads(out.read_text())["results"][0]
    assert cell["status"] == "unsupported" and "two CPUs" in cell["reason"]


def _descendants_named(name: str) -> list[int]:
    """Our descendants whose comm is ``name`` (flow workers name themselves, e.g. zcnet-tx0)."""
    me, found = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if (d / "comm").read_text().strip() != name:
                continue
            pid = int(d.name)
            while pid > 1:
                pid = int((Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]).split()[1])
                if pid == me:
                    found.append(int(d.name))
                    break
        except (OSError, ValueError, IndexError):
            continue
    return found


def _kill_first_sender(stop: threading.Event) -> None:
    while not stop.is_set():
        for pid in _descendants_named("zcnet-tx0"):
            time.sleep(0.3)
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.02)


def test_peer_dying_mid_cell_is_an_error_cell_and_the_run_goes_on(no_leaks) -> None:
    stop = threading.Event()
    killer = threading.Thread(target=_kill_first_sender, args=(stop,))
    killer.start()
    try:
        lo = int(Path("/sys/class/net/lo/mtu").read_text())
        doc = run_bench(BenchOptions(mtus=(lo,), engines=("epoll", "uring"), placements=("same",),
                                     duration=1.5, lab=False))
    finally:
        stop.set()
        killer.join()
    first, second = doc.results
    assert first.status == "error" and "tx worker" in first.reason
    assert second.status == "ok"


def _tagged_processes(tag: str) -> list[int]:
    """Processes whose environment carries ``tag``: the run's whole tree, however re-parented."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if tag.encode() in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found


@pytest.mark.root
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_bench_leaves_nothing(no_leaks, tmp_path: Path, sig: int) -> None:
    before = set(list_netns())
    out = tmp_path / "partial.json"
    tag = f"ZCNET_TEST_RUN={uuid.uuid4().hex}"
    env = {**os.environ, tag.split("=")[0]: tag.split("=")[1]}
    p = subprocess.Popen([*ZCNET, "bench", "--duration", "1", "--json", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the first cell is in the file
        try:
            if json.loads(out.read_text())["results"]:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "Traceback" not in err
    # Nothing of this run's namespaces is left (bench may also have swept stale labs it found;
    # labs of other live processes on this machine may come and go meanwhile).
    new = [ns for ns in set(list_netns()) - before
           if (lab := names.parse_netns(ns)) is None or lab.owner == p.pid]
    assert not new
    # Nothing of the run remains: workers, the lab's servers, their forkservers.
    time.sleep(0.5)
    assert not _tagged_processes(tag)
    # Cells completed before the signal are kept.
    assert json.loads(out.read_text())["results"]


@pytest.mark.skipif(not Path("/usr/bin/setpriv").exists(), reason="needs setpriv (util-linux)")
def test_without_capabilities_bench_falls_back_to_loopback_and_says_so(no_leaks,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "nocap.json"
    r = subprocess.run(["setpriv", "--inh-caps=-all", "--ambient-caps=-all",
                        "--bounding-set=-net_admin,-sys_admin", *ZCNET, "bench", "--engine",
                        "epoll", "--placement", "same", "--duration", "0.3", "--json", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "running on 127.0.0.1" in r.stderr
    doc = json.loads(out.read_text())
    assert doc["env"]["lab"] is False
    (cell,) = doc["results"]  # one row: lo's own MTU, not three n/a rows
    assert cell["status"] == "ok" and cell["mtu"] == int(Path("/sys/class/net/lo/mtu").read_text())


@pytest.mark.timeout(150)
def test_unwritable_json_path_fails_before_measuring(no_leaks, tmp_path: Path) -> None:
    # An hour-long cell: had it started, the run would not end before the timeout.
    r = zcnet("bench", "--no-lab", "--engine", "epoll", "--placement", "same", "--duration",
              "3600", "--json", str(tmp_path / "missing" / "x.json"), timeout=120)
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # and no temp file was left
