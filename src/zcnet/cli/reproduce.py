"""`zcnet reproduce [NAME]`: the seed documents' experiments in one command (no NAME: list them)."""

from __future__ import annotations

import argparse

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zcnet.bench.spec import builtin_names, builtin_spec, builtin_text
from zcnet.cli._args import Subparsers
from zcnet.cli.run import add_run_options, execute
from zcnet.report.export import make_console


def _list(console: Console) -> int:
    # The seed's file name says nothing to a reader; `--show` prints it with the rest.
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for col in ("name", "tool", "what it measures"):
        t.add_column(col, no_wrap=col != "what it measures")
    for name in builtin_names():
        spec = builtin_spec(name)
        t.add_row(name, spec.tool, spec.title)
    console.print(Text("built-in experiments (zcnet reproduce NAME)", style="bold"))
    console.print(t)
    console.print("copy one to edit it: zcnet reproduce NAME --show > my.toml; "
                  "then: zcnet run my.toml", style="dim", highlight=False)
    return 0


def _handler(args: argparse.Namespace) -> int:
    console = make_console()
    if not args.name:
        return _list(console)
    if args.show:
        # Raw text, not rich: the output is meant to be redirected into a file.
        print(builtin_text(args.name), end="")
        return 0
    return execute(builtin_spec(args.name), args)


def register(sub: Subparsers) -> None:
    p = sub.add_parser("reproduce", help="run a seed experiment (no NAME: list them)",
                       description="Reproduce the experiments of the seed documents on this "
                       "machine. In the lab, rows the hardware cannot run are substituted and "
                       "the output says which and why; with --ifname they run for real.")
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("--show", action="store_true", help="print the experiment's TOML spec")
    add_run_options(p)
    p.set_defaults(func=_handler)
