"""Cells: what identifies one measured combination, and the metrics it carries.

A result row in any envelope (bench, txbench, experiment) is one cell measured once. Repeats of a
cell share its key and differ in ``repeat``. The key is made of whichever identifying fields the row
has, so bench rows (engine, mtu, placement) and txbench rows (mode, payload, burst) share code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from zcnet import quantities
from zcnet.bench.cpustat import SHARES
from zcnet.bench.metrics import METRICS
from zcnet.errors import UsageError
from zcnet.report.stats import Summary, summarize

# Fields that say *what* was measured; anything else in a row is a measurement or a note.
KEY_FIELDS = ("experiment", "variant", "engine", "mode", "tx", "consumer", "placement", "mtu",
              "payload", "burst", "peer")


CellKey = tuple[tuple[str, Any], ...]


def cell_key(row: dict[str, Any]) -> CellKey:
    return tuple((f, row[f]) for f in KEY_FIELDS if row.get(f) is not None)


def key_text(key: CellKey) -> str:
    return " ".join(f"{f}={v}" for f, v in key)


def metric_value(row: dict[str, Any], name: str) -> float | None:
    """A metric of an ``ok`` row, derived where the row holds its ingredients."""
    if row.get("status", "ok") != "ok":
        return None
    if name in row and isinstance(row[name], (int, float)) and not isinstance(row[name], bool):
        return float(row[name])
    derive = _DERIVED.get(name)
    return derive(row) if derive else None


def _mbps(row: dict[str, Any]) -> float | None:
    if isinstance(row.get("gbps"), (int, float)):
        return float(row["gbps"]) * 1000 / 8
    return None


def _rx_busy(row: dict[str, Any]) -> float | None:
    rx = (row.get("cpu") or {}).get("rx") or {}
    if "busy" in rx:
        return float(rx["busy"])
    if "idle" in rx:
        return 100.0 - float(rx["idle"]) - float(rx.get("iowait", 0.0))
    return None


_DERIVED = {"mbps": _mbps, "rx_busy": _rx_busy}


@dataclass
class Cell:
    """All repeats of one key."""

    key: CellKey
    rows: list[dict[str, Any]]

    @property
    def fields(self) -> dict[str, Any]:
        return dict(self.key)

    @property
    def status(self) -> str:
        statuses = {r.get("status", "ok") for r in self.rows}
        return "ok" if "ok" in statuses else sorted(statuses)[0]

    @property
    def reason(self) -> str:
        return next((str(r["reason"]) for r in self.rows if r.get("reason")), "")

    def values(self, metric: str) -> list[float]:
        return [v for r in self.rows if (v := metric_value(r, metric)) is not None]

    def summary(self, metric: str) -> Summary | None:
        vals = self.values(metric)
        return summarize(vals) if vals else None


def group(rows: Iterable[dict[str, Any]]) -> dict[CellKey, Cell]:
    """Rows grouped by key, in first-seen order."""
    cells: dict[CellKey, Cell] = {}
    for row in rows:
        key = cell_key(row)
        cells.setdefault(key, Cell(key, [])).rows.append(row)
    return cells


def metrics_present(cells: Iterable[Cell]) -> list[str]:
    cells = list(cells)
    return [m for m in METRICS if any(c.values(m) for c in cells)]


# Fields of a result row read back from a file that are measured figures: never negative,
# never NaN or infinite.
FIGURE_FIELDS = ("seconds", "bytes", "sent", "received", *(m for m in METRICS if m != "rx_busy"))
CPU_SHARE_FIELDS = (*SHARES, "busy")


def _bad(row: dict[str, Any]) -> tuple[str, Any, str] | None:
    """The first field of ``row`` that is not a valid figure: (field, value, problem)."""
    for name in FIGURE_FIELDS:
        v = row.get(name)
        if v is not None and (why := quantities.problem("figure", v)) is not None:
            return name, v, why
    for name in KEY_FIELDS:
        v = row.get(name)
        if v is not None and (not isinstance(v, (str, int, float)) or isinstance(v, bool)
                              or (isinstance(v, float) and not math.isfinite(v))):
            return name, v, "must be a name or a number"
    for name in ("status", "reason", "warning"):
        if not isinstance(row.get(name, ""), str):
            return name, row[name], "must be text"
    if not isinstance(row.get("warnings", []), list) or not all(
            isinstance(w, str) for w in row.get("warnings", [])):
        return "warnings", row["warnings"], "must be a list of texts"
    cv = row.get("interval_cv")
    if cv is not None and (why := quantities.problem("figure", cv)) is not None:
        return "interval_cv", cv, why
    for name in ("cpu", "cpus", "verify", "tx_stats", "engine_stats", "tcp"):
        if row.get(name) is not None and not isinstance(row[name], dict):
            return name, row[name], "must be an object"
    for name in ("cpu", "cpus"):
        for key, v in (row.get(name) or {}).items():
            if v is not None and not isinstance(v, dict):
                return f"{name}.{key}", v, "must be an object of CPU shares"
    for name in ("mtu", "burst", "payload"):
        v = row.get(name)
        if v is None or (name == "payload" and isinstance(v, str)):  # "64,128": a size pattern
            continue
        if (why := quantities.problem(name, v)) is not None:
            return name, v, why
    cpus = row.get("cpus") or {}
    if not isinstance(cpus, dict) or not all(str(c).isdigit() for c in cpus):
        return "cpus", cpus, "must map CPU numbers to shares"
    cpu = row.get("cpu") if isinstance(row.get("cpu"), dict) else {}
    shares = [(f"cpu.{side}.{k}", v.get(k)) for side, v in cpu.items() if isinstance(v, dict)
              for k in CPU_SHARE_FIELDS if k in v]
    shares += [(f"cpus.{c}.{k}", v.get(k)) for c, v in (row.get("cpus") or {}).items()
               if isinstance(v, dict) for k in CPU_SHARE_FIELDS if k in v]
    for field, v in shares:
        if (why := quantities.problem("share", v)) is not None:
            return field, v, why
    return None


def check_figures(doc: dict[str, Any], source: str) -> None:
    """Refuse a result file whose rows carry NaN, infinite, negative or out-of-range figures
    (hand-edited or damaged): a report built on them would print nonsense."""
    for i, row in enumerate(doc.get("results") or []):
        if not isinstance(row, dict):
            raise UsageError(f"{source}: results[{i}] is not an object",
                             "give a file written by --json/--out")
        if (bad := _bad(row)) is not None:
            field, value, why = bad
            raise UsageError(f"{source}: results[{i}].{field} = {value!r}: {why}",
                             "give a file written by --json/--out (not edited by hand)")
