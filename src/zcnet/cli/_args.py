"""Argument types shared by the subcommands (a leading underscore: not a subcommand itself)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a number of ``kind`` greater than zero, else a one-line error."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse
