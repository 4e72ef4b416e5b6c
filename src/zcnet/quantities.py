"""Every number a user can give zcnet, with the one range it may take.

Command-line options (``zcnet.cli._args.number``), experiment specs and result files read back by
``compare``/``run --report`` all check their numbers here, so a quantity such as an MTU or a
duration has a single allowed range wherever it is typed. NaN and infinities are never in range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zcnet.errors import UsageError


@dataclass(frozen=True)
class Quantity:
    name: str
    kind: type[int] | type[float]
    min: float
    max: float
    unit: str = ""
    why: str = ""  # what sets the bounds, for the error message

    def range_text(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{_show(self.min)}..{_show(self.max)}{unit}"

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not a valid amount of this quantity, or None."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"expected a number, got {value!r}"
        if self.kind is int and not isinstance(value, int):
            return f"expected a whole number, got {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if not self.min <= value <= self.max:
            why = f" ({self.why})" if self.why else ""
            return f"must be within {self.range_text()}{why}, got {value!r}"
        return None


def _show(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


IORING_MAX_ENTRIES = 32768  # the largest submission queue io_uring sets up

QUANTITIES: dict[str, Quantity] = {q.name: q for q in (
    Quantity("duration", float, 0.01, 3600.0, "s", "seconds per measurement"),
    Quantity("timeout", float, 0.1, 86400.0, "s"),
    Quantity("mtu", int, 68, 65536, "bytes", "the IPv4 minimum to loopback's MTU"),
    Quantity("repeat", int, 1, 10000),
    Quantity("payload", int, 1, 65507, "bytes", "a UDP datagram's payload"),
    Quantity("burst", int, 1, IORING_MAX_ENTRIES, "packets",
             f"io_uring's largest ring holds {IORING_MAX_ENTRIES} sends"),
    Quantity("packets", int, 1, 10**10, "packets"),
    Quantity("flows", int, 1, 1024, "flows"),
    Quantity("port", int, 1, 65535),
    Quantity("queue", int, 0, 65535, "", "a NIC queue id"),
    Quantity("cpu", int, 0, 8191, "", "a CPU number"),
    Quantity("buffer", int, 1, 64 << 20, "bytes", "one read/write/request/response buffer"),
    Quantity("memory", int, 1 << 20, 1 << 40, "bytes"),
    Quantity("attempts", int, 1, 100000),
    # Figures read back from result files.
    Quantity("share", float, 0.0, 100.0, "%"),
    Quantity("figure", float, 0.0, 1e15, "", "a measured rate or cost is never negative"),
)}


def problem(name: str, value: object) -> str | None:
    return QUANTITIES[name].problem(value)


def check(name: str, value: object, what: str | None = None, hint: str | None = None) -> None:
    """Raise a UsageError naming ``what`` (default: the quantity) unless ``value`` is valid."""
    if (why := problem(name, value)) is not None:
        q = QUANTITIES[name]
        raise UsageError(f"{what or name}: {why}",
                         hint or f"give a {q.kind.__name__} within {q.range_text()}")


def parse(name: str, text: str) -> int | float:
    """A number of quantity ``name`` from text; ValueError with a one-line reason otherwise."""
    q = QUANTITIES[name]
    try:
        value: int | float = q.kind(text.strip())
    except (ValueError, OverflowError):
        raise ValueError(f"not {'a whole number' if q.kind is int else 'a number'}: "
                         f"{text!r}") from None
    if (why := q.problem(value)) is not None:
        raise ValueError(why)
    return value
