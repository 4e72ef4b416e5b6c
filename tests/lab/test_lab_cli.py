"""`zcnet lab up|status|down` end to end, and its one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zcnet.cli import main
from zcnet.lab import Lab
from zcnet.lab.rtnl import rtnl
from zcnet.lab.sweep import find_labs, take_down
from zcnet.netns import netns_exists

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("no_leaks")]


def _new_persistent(before: set[str]) -> list[str]:
    return sorted(n for n in find_labs() if n.startswith("zcup") and n not in before)


def test_up_status_down(capsys: pytest.CaptureFixture[str], no_leaks: None) -> None:
    before = set(find_labs())
    assert main(["lab", "up", "--mtu", "4000"]) == 0
    made = _new_persistent(before)
    try:
        assert len(made) == 1
        name = made[0]
        up_out = capsys.readouterr().out
        assert name in up_out and "198.18.0.1/30" in up_out
        with rtnl(name + "b") as ipr:
            assert ipr.link("get", ifname=name + "b")[0].get("IFLA_MTU") == 4000

        assert main(["lab", "status"]) == 0
        status = capsys.readouterr().out
        row = next(line for line in status.splitlines() if f"│ {name} " in line)
        assert "persistent" in row and "4000" in row

        assert main(["lab", "down"]) == 0  # the sweep leaves persistent labs alone
        assert netns_exists(name + "a")

        assert main(["lab", "down", name]) == 0
        assert f"removed lab {name}" in capsys.readouterr().out
        assert not netns_exists(name + "a") and not netns_exists(name + "b")
    finally:
        for leftover in _new_persistent(before):
            take_down(leftover)


def test_up_without_ipv6(capsys: pytest.CaptureFixture[str], no_leaks: None) -> None:
    before = set(find_labs())
    assert main(["lab", "up", "--no-ipv6"]) == 0
    (name,) = _new_persistent(before)
    try:
        assert "2001:db8" not in capsys.readouterr().out
    finally:
        take_down(name)


@pytest.mark.parametrize(("argv", "message"), [
    (["lab", "down", "zcup999999"], "no zcnet lab named 'zcup999999'"),
    (["lab", "down", "not-a-lab"], "no zcnet lab named 'not-a-lab'"),
    (["lab", "up", "--mtu", "65536"], "MTU 65536 is out of range"),
])
def test_bad_input_is_one_line(argv: list[str], message: str,
                               capsys: pytest.CaptureFixture[str], no_leaks: None) -> None:
    before = set(find_labs())
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"zcnet: error: {message}" or err[0].startswith(f"zcnet: error: {message}")
    assert all(line.startswith("zcnet: ") for line in err) and len(err) <= 2
    assert set(find_labs()) == before


def test_down_refuses_a_running_owners_lab(capsys: pytest.CaptureFixture[str],
                                           no_leaks: None) -> None:
    with Lab() as lab:
        assert main(["lab", "down", lab.name]) == 1
        assert "belongs to running process" in capsys.readouterr().err
        assert netns_exists(lab.ns_a)
        assert main(["lab", "down", "--force", lab.ns_b]) == 0  # a namespace name works too
        assert not netns_exists(lab.ns_a)


@pytest.mark.parametrize(("mtu", "message"), [("big", "not a whole number: 'big'"),
                                              ("10", "must be within 68..65536")])
def test_bad_mtu_is_rejected_by_argparse(mtu: str, message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "zcnet", "lab", "up", "--mtu", mtu],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
