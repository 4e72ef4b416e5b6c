"""The /proc/self/smaps entry of a mapping: its fields (VmFlags, AnonHugePages, THPeligible)."""

from __future__ import annotations

from pathlib import Path


def smaps_entry(addr: int) -> list[str]:
    """The /proc/self/smaps lines (after the header) of the mapping that holds ``addr``;
    AssertionError if no mapping does."""
    entry: list[str] | None = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        span = _span(line)
        if span is not None:
            if entry is not None:
                break
            entry = [] if span[0] <= addr < span[1] else None
        elif entry is not None:
            entry.append(line)
    assert entry is not None, f"no smaps entry holds {addr:#x}"
    return entry


def field(entry: list[str], name: str) -> list[str]:
    """The words after ``name:`` in ``entry`` ([] if the kernel has no such line)."""
    for line in entry:
        key, _, rest = line.partition(":")
        if key == name:
            return rest.split()
    return []


def _span(line: str) -> tuple[int, int] | None:
    """(start, end) of an smaps header line ("start-end perms ..."), else None."""
    start, _, end = line.split(" ", 1)[0].partition("-")
    try:
        return int(start, 16), int(end, 16)
    except ValueError:
        return None
