"""The `zcnet` command.

Each module in this package that defines ``register(subparsers)`` adds one subcommand, named as
the module, so that features land without editing a central table. A handler returns the process
exit status.

A command line that names its subcommand imports that module alone: importing all of them (the
benchmark, the report, rich, pyroute2) was ~75% of every start-up, 0.35 s here and ~10 s in a
TCG guest, paid again by each ``zcnet server`` a benchmark starts in its namespaces.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys
from collections.abc import Sequence

from zcnet import __version__
from zcnet.errors import ZcnetError
from zcnet.netns import NeedRoot


def commands() -> list[str]:
    """The subcommands, by module name."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def named_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names, or None when the whole parser is needed: no command, an
    unknown one (the error lists the choices) or top-level help before it."""
    for token in argv:
        if token in ("-h", "--help", "--version", "--"):
            return None
        if not token.startswith("-"):
            return token if token in commands() else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with ``only`` that one alone."""
    parser = argparse.ArgumentParser(
        prog="zcnet",
        description="Zero-copy networking for Python, and the benchmark that proves it.",
    )
    parser.add_argument("--version", action="version", version=f"zcnet {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in [only] if only else commands():
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser,
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args``, but ``--opt=--`` is an error: argparse drops the ``--`` and would
    hand the option an empty list instead of a value."""
    for token in sys.argv[1:] if argv is None else argv:
        if token.startswith("-") and token.endswith("=--"):
            parser.error(f"argument {token.split('=', 1)[0]}: '--' is not a value")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(named_command(sys.argv[1:] if argv is None else argv))
    args = parse_args(parser, argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="zcnet: %(levelname)s: %(message)s",
    )
    handler = getattr(args, "func", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except ZcnetError as exc:
        hint = exc.hint
        around = getattr(args, "without_lab", None)  # the command's way around the lab
        if isinstance(exc, NeedRoot) and around:
            hint = f"{hint}, or pass {around}" if hint else f"pass {around}"
        print(f"zcnet: error: {exc.message}", file=sys.stderr)
        if hint:
            print(f"zcnet: fix: {hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("zcnet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``zcnet ... | head``): not an error worth a traceback.
        sys.stderr.close()
        return 141
