"""Argument types shared by the subcommands (a leading underscore: not a subcommand itself).

Numbers go through ``zcnet.quantities``, so an option has the same range as the spec key or the
result field of the same quantity. Lists are comma-separated, never empty, never repeat an item.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Hashable, Iterable, Sequence
from pathlib import Path
from typing import TypeAlias, TypeVar

from zcnet import quantities
from zcnet.errors import UsageError
from zcnet.nic.ifname import ifname_problem

# What ``register(sub)`` of each subcommand gets: argparse's subparsers of the ``zcnet`` parser.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
H = TypeVar("H", bound=Hashable)


def number(name: str) -> Callable[[str], int | float]:
    """An argparse type: a number of quantity ``name`` within its one range."""
    def parse(text: str) -> int | float:
        try:
            return quantities.parse(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = name  # argparse names the type in "invalid NAME value" messages
    return parse


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a finite number of ``kind`` greater than zero, else a one-line error."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (0 < value < float("inf")):  # also refuses NaN
            raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
        return value
    return parse


def items(text: str, what: str) -> list[str]:
    """The comma-separated items of ``text``; an empty list or a repeated item is an error."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"empty {what} list")
    if "" in parts:
        raise argparse.ArgumentTypeError(f"empty item in {what} list {text!r}")
    seen: set[str] = set()
    for p in parts:
        if p in seen:
            raise argparse.ArgumentTypeError(f"{what} {p!r} given twice in {text!r}")
        seen.add(p)
    return parts


def choice_list(what: str, choices: Sequence[str] | Callable[[], Sequence[str]],
                ) -> Callable[[str], tuple[str, ...]]:
    """A comma-separated list of names from ``choices`` (a sequence, or a function giving one)."""
    def parse(text: str) -> tuple[str, ...]:
        valid = choices() if callable(choices) else choices
        out = items(text, what)
        bad = [v for v in out if v not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad[0]!r}; choose from "
                                             f"{', '.join(valid)}")
        return tuple(out)
    parse.__name__ = f"{what} list"
    return parse


def number_list(name: str, what: str, *, unique: bool = True,
                ) -> Callable[[str], tuple[int | float, ...]]:
    """A comma-separated list of quantity ``name``; ``unique=False`` allows repeats (patterns)."""
    def parse(text: str) -> tuple[int | float, ...]:
        parts = items(text, what) if unique else [p.strip() for p in text.split(",")]
        if not unique and (not any(parts) or "" in parts):
            raise argparse.ArgumentTypeError(f"empty item in {what} list {text!r}")
        out = []
        for p in parts:
            try:
                out.append(quantities.parse(name, p))
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"{what} {p!r}: {exc}") from None
        return tuple(out)
    parse.__name__ = f"{what} list"
    return parse


def span_list(name: str, what: str, limit: int = 1024) -> Callable[[str], tuple[int, ...]]:
    """A comma-separated list of integer quantity ``name`` in which ``A-B`` stands for A to B
    (``2,3``, ``9000-9007``); no value twice, at most ``limit`` values."""
    def value(text: str) -> int:
        try:
            return int(quantities.parse(name, text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{what} {text.strip()!r}: {exc}") from None

    def parse(text: str) -> tuple[int, ...]:
        out: list[int] = []
        for item in items(text, what):
            lo, dash, hi = item.partition("-")
            first, last = value(lo), value(hi) if dash else value(lo)
            if first > last:
                raise argparse.ArgumentTypeError(f"{what} range {item!r} runs backwards")
            out.extend(range(first, last + 1))
            if len(out) > limit:
                raise argparse.ArgumentTypeError(f"more than {limit} {what}s in {text!r}")
        if len(set(out)) != len(out):
            raise argparse.ArgumentTypeError(f"a {what} is given twice in {text!r}")
        return tuple(out)
    parse.__name__ = f"{what} list"
    return parse


def unique(values: Iterable[H]) -> list[H]:
    """Values in first-seen order without repeats (for repeatable options)."""
    return list(dict.fromkeys(values))


def check_output_file(path: str | None, option: str) -> None:
    """Fail before measuring when ``path`` cannot be created or replaced."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {path} is a directory", "give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: directory {parent} does not exist",
                         "create it first or give a path in an existing directory")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{option} {path}: not writable", "give a path you may write to")
    if p.exists() and not p.is_file():
        return  # /dev/null, a FIFO: written in place, nothing to create
    # Permissions do not tell everything (root, /proc, read-only mounts): create the temporary
    # file the atomic write will use, and remove it again.
    probe = parent / f".{p.name}.{os.getpid()}.tmp"
    try:
        probe.touch(exist_ok=False)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write there: {exc.strerror or exc}",
                         "give a path in a writable directory") from None
    probe.unlink()


def check_output_dir(path: str | None, option: str) -> None:
    """Fail before measuring when directory ``path`` exists as a file or cannot be created."""
    if not path:
        return
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise UsageError(f"{option} {path} is not a directory", "give a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise UsageError(f"{option} {path}: not writable", "give a directory you may write to")
        return
    ancestor = p.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path} cannot be created under {ancestor}",
                         "give a directory you may write to")


def ifname(text: str) -> str:
    """An argparse type: a name the kernel would take for an interface (it may not exist)."""
    if (why := ifname_problem(text)) is not None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an interface name: it {why}")
    return text


def check_ifname(name: str | None, option: str = "--ifname") -> None:
    """Fail before measuring when ``name`` is no interface of this network namespace."""
    if name is None:
        return
    if (why := ifname_problem(name)) is not None:
        raise UsageError(f"{option} {name!r} is not an interface name: it {why}",
                         "give a name from `ip link`, e.g. eth0")
    if not (Path("/sys/class/net") / name).exists():
        raise UsageError(f"{option} {name!r}: no such network interface here",
                         "give a name from `ip link`")
