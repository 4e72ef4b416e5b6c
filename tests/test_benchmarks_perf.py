"""The speed benchmarks of issue 12 run end to end (tiny sizes; no timing is asserted): the
replay drives the real soft and zcrx providers through every mode, and each script ends with
its target lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def run(script: str, *args: str) -> str:
    p = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    return p.stdout


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
