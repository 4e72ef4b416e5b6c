"""The `zcnet` command line imports only the subcommand it names, and still knows them all."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from zcnet.cli import build_parser, commands, named_command

LOADED = """
import sys
from zcnet.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(sorted(m for m in sys.modules if m.startswith("zcnet.cli."))))
"""


def _cli_modules(*argv: str) -> set[str]:
    r = subprocess.run([sys.executable, "-c", LOADED, *argv], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.splitlines()[-1].split())  # the help text comes before


def test_each_command_module_registers_the_command_it_is_named_for():
    # What loading one module for a named command relies on.
    assert {"bench", "lab", "nic", "server", "vm"} <= set(commands())
    for name in commands():
        sub = next(a for a in build_parser(name)._actions
                   if isinstance(a, argparse._SubParsersAction))
        assert set(sub.choices) == {name}


@pytest.mark.parametrize(("argv", "named"), [
    (["nic", "doctor", "eth0"], "nic"),
    (["-v", "-v", "server", "--help"], "server"),
    (["--verbose", "lab", "status"], "lab"),
    ([], None),
    (["-h", "bench"], None),          # top-level help: every command listed
    (["--version"], None),
    (["benchh", "--duration", "1"], None),  # unknown: the error lists the choices
])
def test_named_command(argv, named):
    assert named_command(argv) == named


def test_a_named_command_loads_its_module_alone():
    nic = _cli_modules("nic", "--help")
    assert "zcnet.cli.nic" in nic and nic <= {"zcnet.cli.nic", "zcnet.cli._args"}
    assert _cli_modules("server", "--help") <= {"zcnet.cli.server", "zcnet.cli._args"}


def test_top_level_help_and_unknown_commands_still_list_every_command():
    r = subprocess.run([sys.executable, "-m", "zcnet", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0
    for name in commands():
        assert name in r.stdout
    r = subprocess.run([sys.executable, "-m", "zcnet", "benchh"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert "invalid choice: 'benchh'" in r.stderr and "bench" in r.stderr.split("choose from")[1]


def test_only_parser_parses_like_the_whole_one():
    argv = ["nic", "doctor", "eth0", "--queue", "3"]
    whole = vars(build_parser().parse_args(argv))
    alone = vars(build_parser("nic").parse_args(argv))
    assert {k: v for k, v in whole.items() if k != "func"} == \
        {k: v for k, v in alone.items() if k != "func"}
