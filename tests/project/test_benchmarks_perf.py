"""The speed benchmarks of issue 12 run end to end (tiny sizes; no timing is asserted): the
replay drives the real soft and zcrx providers through every mode, and each script ends with
its target lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paths import ROOT

BENCH = ROOT / "benchmarks"


def run(script: str, *args: str) -> str:
    p = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    return p.stdout


def refuses(script: str, *cases: tuple[list[str], str]) -> None:
    """Each (options, message): the script exits with the message and no traceback."""
    for bad, msg in cases:
        p = subprocess.run([sys.executable, str(BENCH / script), *bad], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode != 0 and "Traceback" not in p.stderr and msg in p.stderr


def test_zc_replay_runs_every_provider_and_mode() -> None:
    out = run("zc_replay.py", "--chunks", "3000", "--batch", "64", "--repeat", "1",
              "--sizes", "4,64")
    rows = [line.split() for line in out.splitlines() if line.startswith(("soft ", "zcrx "))]
    skipped = [line for line in out.splitlines() if line.startswith("zcrx replay skipped")]
    if skipped and "MEMLOCK" in skipped[0]:
        pytest.skip(skipped[0])  # unprivileged with a small RLIMIT_MEMLOCK
    assert not skipped, "the zcrx replay could not build the provider"
    assert {(r[0], r[1], r[2]) for r in rows} == {
        (k, s, m) for k in ("soft", "zcrx") for s in ("4Ki", "64Ki")
        for m in ("recv_batch", "iterator", "release_many")}
    assert all(float(r[3]) > 0 for r in rows)
    names = {line.split()[1] for line in out.splitlines() if line.startswith("target ")}
    assert {"soft_recv_batch_4k", "soft_recv_batch_4k_ms_per_gib", "soft_iterator_4k"} <= names


def test_ring_nop_runs_against_its_c_loop() -> None:
    out = run("ring_nop.py", "--seconds", "0.05", "--rounds", "1")
    names = {line.split()[1] for line in out.splitlines() if line.startswith("target ")}
    assert {"ring_nop_batch1", "ring_nop_batch32", "ring_nop_batch1024"} <= names


def test_cq_mixed_reaps_every_ring_kind_on_each_path() -> None:
    out = run("cq_mixed.py", "--seconds", "0.02", "--rounds", "1", "--batch", "16")
    rows = [line.split() for line in out.splitlines() if line.startswith(("c ", "pure "))]
    assert {r[1] for r in rows} == {"cqe32", "mixed-big", "mixed-half"}
    # CQ bytes per 16 CQEs: 32 each, and 16 for each small one of the half-and-half ring
    assert {r[1]: int(r[4]) for r in rows} == {"cqe32": 512, "mixed-big": 512,
                                               "mixed-half": 384}
    assert any(line.startswith("target mixed_big_reap_") for line in out.splitlines())


def _tcp_zc_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tcp_zc_loopback", BENCH / "tcp_zc_loopback.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.root
def test_tcp_zc_loopback_maps_order0_pages_and_puts_the_sysctl_back() -> None:
    sysctl = Path(_tcp_zc_module().SYSCTL)
    before = sysctl.read_text()
    out = run("tcp_zc_loopback.py", "--mib", "64", "--repeat", "1")
    if "no C compiler" in out:
        pytest.skip(out.strip())
    assert sysctl.read_text() == before
    rows = {(r[0], r[2]): r for r in (line.split() for line in out.splitlines())
            if len(r) > 3 and r[1] == "pages"}
    assert set(rows) == {(k, m) for k in ("compound", "order0")
                         for m in ("read", "TCP_ZEROCOPY_RECEIVE")}
    # With order-0 pages the kernel maps payload into the window: the row measures a mapping
    # receive, not a copy in disguise.
    mapped = rows[("order0", "TCP_ZEROCOPY_RECEIVE")]
    assert int(mapped[mapped.index("mapped") + 1].rstrip("%")) > 0


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_tcp_zc_order0_block_restores_the_old_value_when_stopped(tmp_path, monkeypatch, stop):
    mod = _tcp_zc_module()
    fake = tmp_path / "high_order_alloc_disable"
    fake.write_text("0\n")
    monkeypatch.setattr(mod, "SYSCTL", str(fake))
    with pytest.raises(stop), mod.order0_pages():
        assert fake.read_text() == "1"
        raise stop
    assert fake.read_text() == "0"


def test_zc_rx_pins_the_sender_apart_from_the_receiver_and_names_a_bad_cpu() -> None:
    """``--cpu`` pins the receiver; the sender, a forked child, no longer inherits that pinning
    but runs on the other CPUs (the header says where each ran). A CPU the process may not use
    is refused by name, before any flow starts."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    out = run("zc_rx.py", "--rounds", "1", "--mib", "16", "--cpu", str(cpus[0]))
    others = ",".join(map(str, cpus[1:]))
    assert f"receiver on {cpus[0]} CPU, sender on {others}," in out
    assert "target softzc_vs_uring_mshot" in out
    p = subprocess.run([sys.executable, str(BENCH / "zc_rx.py"), "--cpu", "4096"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "CPU 4096 is not one this process may run on" in p.stderr


def test_aio_churn_serves_every_connection_on_each_server_and_refuses_bad_options() -> None:
    """Each server echoes every connection (the client fails the run otherwise), with and
    without keep_ring holding the loop's ring; the rows and report lines come out; bad
    options are refused by name."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    out = run("aio_churn.py", "--connections", "20", "--rounds", "1", "--concurrency", "1,3")
    for name in ("uvloop-proto", "zcnet", "zcnet-proto", "zcnet/kept", "zcnet-proto/kept"):
        rows = [ln for ln in out.splitlines() if ln.strip().startswith(name + " ")]
        assert len(rows) == 2 and all("connections/s" in r for r in rows), out
    assert "target churn_3_zcnet_vs_uvloop_proto" in out
    assert "target churn_1_zcnet-proto/kept_vs_uvloop_proto" in out
    refuses("aio_churn.py", (["--concurrency", "x"], "--concurrency takes numbers"),
            (["--only", "nginx"], "unknown server 'nginx'"))


def test_uring_pool_checks_every_byte_through_one_shared_group_and_refuses_bad_sizes() -> None:
    """With 20 streams on one pool of eight 4 KiB buffers every pass runs the pool dry, so
    receives end with -ENOBUFS and are re-armed a few at a time; every byte of every stream
    is checked against the pattern, in both layouts. Bad sizes are refused by name."""
    out = run("uring_pool.py", "--gib", "0.02", "--rounds", "1", "--streams", "20", "--pool",
              "32", "--area", "64", "--buf", "4", "--verify", "--no-aio")
    assert "every byte verified" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("  ")}
    assert set(rows) == {"per-stream", "pool"}, out
    nobufs = int(rows["pool"].split("-ENOBUFS ")[1].rstrip(")"))
    assert nobufs > 0, out  # the pool did run dry, and the run still completed
    assert "pool / per-stream:" in out
    refuses("uring_pool.py", (["--pool", "96"], "--pool must be a power-of-two number of --buf"),
            (["--streams", "0"], "--streams must be positive"))
