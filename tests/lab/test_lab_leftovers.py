"""Leftover labs when a benchmark starts, and a Lab entered twice.

A stale lab (its owner died by SIGKILL) is removed when `zcnet bench` starts; a lab of another
running process is left alone and announced. A nested `with` on one Lab is refused: the inner
exit would take the lab down under the outer block."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import zcnet
from zcnet.errors import ClosedError, UsageError
from zcnet.lab import Lab, names
from zcnet.lab.sweep import before_run
from zcnet.netns import netns_exists

pytestmark = pytest.mark.root

SRC = str(Path(zcnet.__file__).resolve().parents[1])
HOLD = ("from zcnet.lab import Lab\n"
        "with Lab(ipv6=False) as lab:\n"
        "    print(lab.name, flush=True)\n"
        "    input()\n")


@contextmanager
def lab_of_child() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A lab held by a child process until it reads a line (or is killed). Always reaped."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})
    try:
        assert proc.stdout is not None
        name = proc.stdout.readline().strip()
        assert name, proc.communicate(timeout=20)[1]
        yield proc, name
    finally:
        if proc.poll() is None:
            proc.communicate("\n", timeout=20)
        else:
            proc.communicate(timeout=20)


def present(name: str) -> bool:
    lab = names.parse_lab(name)
    assert lab is not None
    return any(netns_exists(ns) for ns in lab.namespaces)


@contextmanager
def stale_lab() -> Iterator[str]:
    with lab_of_child() as (proc, name):
        proc.kill()  # nothing in the child can run: the lab stays, stale
        proc.wait(timeout=10)
    assert present(name)
    try:
        yield name
    finally:
        if present(name):  # the code under test failed to remove it
            before_run()


def test_before_run_removes_stale_and_announces_live(no_leaks: None,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zcnet.lab.sweep")
    with stale_lab() as dead, lab_of_child() as (_, live), Lab(ipv6=False) as mine:
        removed, others = before_run()
        assert dead in removed and not present(dead)
        assert live in [o.name for o in others] and present(live)
        assert mine.name not in [o.name for o in others]  # our own lab is no news
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(live in w and "running process" in w for w in warned)
        assert not any(mine.name in w for w in warned)


BENCHES = {
    "bench": ["bench", "--lab", "--engine", "epoll", "--placement", "same", "--mtu", "1500",
              "--duration", "0.2"],
    "txbench": ["txbench", "--mode", "single", "--duration", "0.2", "--repeat", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(BENCHES))
def test_bench_start_removes_stale_lab_and_prints_live_one(command: str, no_leaks: None) -> None:
    with stale_lab() as dead, lab_of_child() as (_, live):
        proc = subprocess.run(
            [sys.executable, "-m", "zcnet", *BENCHES[command]],
            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": SRC})
        assert proc.returncode == 0, proc.stderr
        assert not present(dead)
        assert present(live)
        assert live in proc.stderr and "Traceback" not in proc.stderr


def test_nested_with_is_refused_and_the_lab_survives(no_leaks: None) -> None:
    with Lab(ipv6=False) as lab:
        with pytest.raises(UsageError, match="already in a `with` block"), lab:
            pass
        assert lab.is_up and netns_exists(lab.ns_a) and netns_exists(lab.ns_b)
        proc = lab.ns_exec(lab.ns_a, ["true"])
        assert proc.wait(timeout=10) == 0
        ns = lab.ns_a
    assert not netns_exists(ns)
    with pytest.raises(ClosedError, match="taken down"):
        lab.ns_exec(ns, ["true"])


def test_a_lab_may_be_entered_again_after_its_block(no_leaks: None) -> None:
    lab = Lab(ipv6=False)
    for _ in range(2):
        with lab:
            assert netns_exists(lab.ns_a)
            ns = lab.ns_a
        assert not netns_exists(ns)
