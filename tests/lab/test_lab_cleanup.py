"""Labs go away however their process ends: signals, forked children, kill -9 plus the sweeper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyroute2 import netns as pr_netns

import zcnet
from zcnet.lab import Lab, names
from zcnet.lab.sweep import find_labs, sweep_stale
from zcnet.netns import netns_exists

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("no_leaks")]

SRC = str(Path(zcnet.__file__).resolve().parents[1])

# Child prologue: bring a lab up, announce its name, then wait to be signalled.
PROLOGUE = """
import os, signal, sys, time
from zcnet.lab import Lab
"""


@contextmanager
def child(body: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Run BODY in a fresh interpreter; it prints the lab name first. Always reaped."""
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", PROLOGUE + textwrap.dedent(body)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        name = proc.stdout.readline().strip()
        if not name:
            raise AssertionError(f"child failed: {proc.communicate(timeout=10)[1]}")
        yield proc, name
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def lab_present(name: str) -> bool:
    lab = names.parse_lab(name)
    assert lab is not None
    return any(netns_exists(ns) for ns in lab.namespaces)


UNMANAGED = """
lab = Lab().up()  # no `with`: only the registry can clean this one up
print(lab.name, flush=True)
time.sleep(60)
"""

MANAGED = """
with Lab() as lab:
    print(lab.name, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("body", [UNMANAGED, MANAGED], ids=["unmanaged", "with"])
def test_sigterm_tears_down(body: str, no_leaks: None) -> None:
    with child(body) as (proc, name):
        assert lab_present(name)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert not lab_present(name)


def test_sigterm_chains_prior_handler(no_leaks: None) -> None:
    body = """
    def prior(signum, frame):
        print("prior handler ran", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, prior)
    lab = Lab().up()
    print(lab.name, flush=True)
    time.sleep(60)
    """
    with child(body) as (proc, name):
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 7
        assert "prior handler ran" in out
    assert not lab_present(name)


@pytest.mark.parametrize("body", [UNMANAGED, MANAGED], ids=["unmanaged", "with"])
def test_sigint_tears_down(body: str, no_leaks: None) -> None:
    # `with` unwinds through __exit__; an unmanaged lab goes at interpreter exit
    with child(body) as (proc, name):
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert "KeyboardInterrupt" in err
    assert not lab_present(name)


def test_forked_children_leave_parent_lab_alone(no_leaks: None) -> None:
    body = """
    import multiprocessing
    from zcnet.netns import netns_exists
    lab = Lab().up()
    print(lab.name, flush=True)
    # a child that exits through sys.exit runs the inherited atexit hooks
    pid = os.fork()
    if pid == 0:
        sys.exit(0)
    os.waitpid(pid, 0)
    # a worker terminated right after start: SIGTERM must still kill it (the prior default
    # action), not vanish into a handler the fresh child cannot run yet, nor touch the lab
    worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    worker.start()
    worker.terminate()
    worker.join()
    print("worker", worker.exitcode, flush=True)
    print("after children", netns_exists(lab.ns_a) and netns_exists(lab.ns_b), flush=True)
    """
    with child(body) as (proc, name):
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "after children True" in out
        assert "worker -15" in out
    assert not lab_present(name)  # and the parent's atexit took the lab down


def test_sigkill_leaves_stale_lab_that_the_sweeper_removes(no_leaks: None) -> None:
    with child(MANAGED) as (proc, name):
        proc.kill()
        proc.wait(timeout=10)
        assert lab_present(name)  # nothing in the process could run
        info = find_labs()[name]
        assert info.owner == proc.pid and info.stale
    with Lab() as mine:  # a live owner's lab must survive the sweep
        swept = sweep_stale()
        assert name in swept
        assert mine.name not in swept and netns_exists(mine.ns_a)
    assert not lab_present(name)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_sweeper_removes_half_built_lab(no_leaks: None) -> None:
    # a process killed between creating its two namespaces leaves one behind, no veth
    lab = names.owned(_dead_pid(), 1)
    pr_netns.create(lab.ns_a)
    try:
        assert find_labs()[lab.name].stale
        assert lab.name in sweep_stale()
        assert not netns_exists(lab.ns_a)
    finally:
        if netns_exists(lab.ns_a):
            pr_netns.remove(lab.ns_a)


def test_persistent_labs_are_never_swept(no_leaks: None) -> None:
    lab = Lab(persistent=True).up()
    try:
        assert lab.name.startswith("zcup")
        assert lab.name not in sweep_stale()
        assert netns_exists(lab.ns_a)
    finally:
        lab.down()


CHURN = """
print("zc0x0", flush=True)  # a placeholder name: labs come and go below
while True:
    with Lab() as lab:
        pass
    Lab().up()  # and some are left to the registry
"""


# how each signal ends the child: our handler's exit status, or Python's own SIGINT re-raise
ENDING = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGHUP: 128 + signal.SIGHUP,
          signal.SIGINT: -signal.SIGINT}


@pytest.mark.parametrize("signum", list(ENDING), ids=lambda s: signal.Signals(s).name)
@pytest.mark.parametrize("delay", [0.05, 0.3])
def test_signal_at_any_moment_leaves_nothing(signum: int, delay: float, no_leaks: None) -> None:
    # the signal lands in up(), down(), pyroute2 or its helper fork, wherever the child is then
    with child(CHURN) as (proc, _):
        time.sleep(delay)
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == ENDING[signum]
    left = [ns for ns in os.listdir("/run/netns") if ns.startswith(f"zc{proc.pid}x")]
    assert left == []
