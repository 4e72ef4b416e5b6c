"""Result documents the report tests read: the JSON files under ``tests/fixtures``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zcnet.bench.records import ResultFile, read_file

FIX = Path(__file__).parent / "fixtures"


def load(name: str) -> dict[str, Any]:
    """A fixture's JSON, as the file holds it (tests change it before reading it back)."""
    return json.loads((FIX / f"{name}.json").read_text())


def record(doc: dict[str, Any]) -> ResultFile:
    """A document as the reports take it: the record a result file is read into."""
    return read_file(doc)


ENGINES = ("epoll", "uring", "uring-mshot", "soft-zc", "zcrx", "devmem")
NO_QUEUE_OPS = ("zcrx", "devmem")  # a veth lab cannot run these: their cells are unsupported


def bench_rows(engines: Sequence[str],
               ok: Callable[[int, str, int, int, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a full `zcnet bench --repeat 3` in a veth lab: every engine at MTU 1500, 4096
    and 9000 in both placements. ``ok(repeat, placement, mtu, index, engine)`` gives the fields
    of a row that ran (it may turn it into an error)."""
    rows = []
    for rep in range(3):
        for p in ("same", "split"):
            for mtu in (1500, 4096, 9000):
                for i, e in enumerate(engines):
                    base = {"engine": e, "mtu": mtu, "placement": p, "repeat": rep}
                    if e in NO_QUEUE_OPS:
                        rows.append({**base, "status": "unsupported",
                                     "reason": f"device lacks queue management ops ({e})"})
                    else:
                        rows.append({**base, "status": "ok", "reason": "", **ok(rep, p, mtu, i, e)})
    return rows
