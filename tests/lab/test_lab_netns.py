"""Entering namespaces: per-thread switch and restore, whole-process entry, names and pids."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import zcnet
from zcnet.lab import Lab, names
from zcnet.netns import NoSuchNetns, in_netns, netns_exists

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

SRC = str(Path(zcnet.__file__).resolve().parents[1])


def _thread_ns() -> str:
    return os.readlink("/proc/thread-self/ns/net")


def _ns_id(name: str) -> str:
    return f"net:[{os.stat(f'/run/netns/{name}').st_ino}]"


@pytest.mark.root
def test_in_netns_moves_only_this_thread_and_restores(no_leaks: None) -> None:
    home = _thread_ns()
    seen_by_other: list[str] = []
    look, looked = threading.Event(), threading.Event()

    def other_thread() -> None:
        look.wait(10)
        seen_by_other.append(_thread_ns())
        looked.set()

    other = threading.Thread(target=other_thread)
    other.start()
    with Lab() as lab:
        with in_netns(lab.ns_a):
            assert _thread_ns() == _ns_id(lab.ns_a)
            look.set()  # a thread that already runs stays where it is
            assert looked.wait(10)
            born_inside: list[str] = []  # while a new thread inherits the namespace
            child = threading.Thread(target=lambda: born_inside.append(_thread_ns()))
            child.start()
            child.join()
            assert born_inside == [_ns_id(lab.ns_a)]
            with in_netns(lab.ns_b):  # nests, and unwinds to the enclosing namespace
                assert _thread_ns() == _ns_id(lab.ns_b)
            assert _thread_ns() == _ns_id(lab.ns_a)
        assert _thread_ns() == home
    other.join()
    assert seen_by_other == [home]


@pytest.mark.root
def test_in_netns_restores_on_exception(no_leaks: None) -> None:
    home = _thread_ns()
    with Lab() as lab:
        with pytest.raises(KeyError), in_netns(lab.ns_b):
            raise KeyError("inside")
        assert _thread_ns() == home


def test_in_netns_none_stays_in_this_namespace(no_leaks: None) -> None:
    home = _thread_ns()
    with in_netns(None):
        assert _thread_ns() == home
    with pytest.raises(KeyError), in_netns(None):
        raise KeyError("inside")
    assert _thread_ns() == home


def test_unknown_namespace(no_leaks: None) -> None:
    home = _thread_ns()
    with pytest.raises(NoSuchNetns), in_netns("zc-no-such-namespace"):
        pass
    assert _thread_ns() == home
    assert not netns_exists("zc-no-such-namespace")


@pytest.mark.parametrize("bad", ["", "..", "a/b"])
def test_bad_namespace_names(bad: str) -> None:
    with pytest.raises(zcnet.errors.ZcnetError, match="bad network namespace name"):
        netns_exists(bad)


@pytest.mark.root
def test_enter_netns_moves_a_fresh_process(no_leaks: None) -> None:
    with Lab() as lab:
        code = ("import os, sys; from zcnet.netns import enter_netns; enter_netns(sys.argv[1]);"
                "print(os.readlink('/proc/self/ns/net'))")
        out = subprocess.run([sys.executable, "-c", code, lab.ns_b], capture_output=True,
                             text=True, timeout=30, env={**os.environ, "PYTHONPATH": SRC},
                             check=True).stdout.strip()
        assert out == _ns_id(lab.ns_b)


@pytest.mark.root
def test_without_capabilities_errors_name_the_fix(no_leaks: None) -> None:
    setpriv = "/usr/bin/setpriv"
    if not os.path.exists(setpriv):
        pytest.skip("setpriv (util-linux) not installed")
    with Lab() as lab:
        code = ("import sys; from zcnet.errors import ZcnetError\n"
                "from zcnet.lab import Lab\nfrom zcnet.netns import enter_netns\n"
                "for step in (lambda: enter_netns(sys.argv[1]), lambda: Lab().up()):\n"
                "    try: step()\n"
                "    except ZcnetError as e: print(type(e).__name__, e.hint)\n")
        out = subprocess.run([setpriv, "--bounding-set=-net_admin,-sys_admin", sys.executable,
                              "-c", code, lab.ns_a], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "PYTHONPATH": SRC}).stdout.splitlines()
    # Said to root: not "run as root", and no option of one command (--no-lab) in library text.
    assert len(out) == 2
    for line in out:
        assert line.startswith("NeedRoot ") and "grant them" in line
        assert "run as root" not in line and "--no-lab" not in line


@pytest.mark.parametrize(("pid", "n"), [(1, 0), (4194304, 9999), (12345, 7)])
def test_owned_names_round_trip_and_fit(pid: int, n: int) -> None:
    lab = names.owned(pid, n)
    assert names.fits(lab)
    assert names.parse_lab(lab.name) == lab
    assert names.parse_netns(lab.ns_a) == lab == names.parse_netns(lab.ns_b)


@pytest.mark.parametrize("foreign", ["zt1", "zc12x3", "zc12x3c", "zcupa", "zc0x1a", "myns", "a"])
def test_foreign_namespaces_are_not_labs(foreign: str) -> None:
    assert names.parse_netns(foreign) is None


def test_pid_alive() -> None:
    assert names.pid_alive(os.getpid())
    proc = subprocess.Popen(["true"])
    while not Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1].startswith("Z"):
        time.sleep(0.001)  # wait until it has exited, still unreaped
    assert not names.pid_alive(proc.pid)  # a zombie owns nothing any more
    proc.wait()
    assert not names.pid_alive(proc.pid)
