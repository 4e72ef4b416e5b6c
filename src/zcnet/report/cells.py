"""Cells: what identifies one measured combination, and the metrics it carries.

A result row in any envelope (bench, txbench, experiment) is one cell measured once. Repeats of a
cell share its key and differ in ``repeat``. The key is made of whichever identifying fields the row
has, so bench rows (engine, mtu, placement) and txbench rows (mode, payload, burst) share code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from zcnet.bench.metrics import METRICS
from zcnet.bench.records import KEY_FIELDS, AxisValue, ResultRow
from zcnet.report.stats import Summary, summarize

CellKey = tuple[tuple[str, AxisValue], ...]


def cell_key(row: ResultRow) -> CellKey:
    return tuple((f, v) for f in KEY_FIELDS if (v := row.axis(f)) is not None)


def key_text(key: CellKey) -> str:
    return " ".join(f"{f}={v}" for f, v in key)


def _mbps(row: ResultRow) -> float | None:
    return row.gbps * 1000 / 8 if row.gbps is not None else None


# Each metric of ``METRICS`` as a row holds it, or derives it from what it holds.
_METRIC_OF: dict[str, Callable[[ResultRow], float | None]] = {
    "gbps": lambda r: r.gbps,
    "mbps": _mbps,
    "mpps": lambda r: r.mpps,
    "ns_per_pkt": lambda r: r.ns_per_pkt,
    "instructions_per_pkt": lambda r: r.instructions_per_pkt,
    "cycles_per_pkt": lambda r: r.cycles_per_pkt,
    "latency_us": lambda r: r.latency_us,
    "rx_busy": ResultRow.rx_busy,
    "zero_copy_share": ResultRow.zero_copy_share,
}
assert set(_METRIC_OF) == set(METRICS), "every metric needs its reader"


_DERIVED = ("mbps", "rx_busy", "zero_copy_share")


def metric_value(row: ResultRow, name: str) -> float | None:
    """A metric of an ``ok`` row (None for a row that did not run, or lacks it)."""
    return _METRIC_OF[name](row) if row.ok else None


def stored_metric(row: ResultRow, name: str) -> float | None:
    """A metric a row holds as a field of its own (not derived), whatever its status."""
    return None if name in _DERIVED else _METRIC_OF[name](row)


def metric_reason(row: ResultRow, name: str) -> str | None:
    """Why a row lacks a metric, where it says (txbench's CPU counters)."""
    return {"instructions_per_pkt": row.instructions_per_pkt_reason,
            "cycles_per_pkt": row.cycles_per_pkt_reason,
            "zero_copy_share": row.zero_copy_reason()}.get(name)


@dataclass
class Cell:
    """All repeats of one key."""

    key: CellKey
    rows: list[ResultRow]

    @property
    def fields(self) -> dict[str, AxisValue]:
        return dict(self.key)

    @property
    def status(self) -> str:
        statuses = {r.status for r in self.rows}
        return "ok" if "ok" in statuses else sorted(statuses)[0]

    @property
    def reason(self) -> str:
        return next((r.reason for r in self.rows if r.reason), "")

    def values(self, metric: str) -> list[float]:
        return [v for r in self.rows if (v := metric_value(r, metric)) is not None]

    def summary(self, metric: str) -> Summary | None:
        vals = self.values(metric)
        return summarize(vals) if vals else None


def group(rows: Iterable[ResultRow]) -> dict[CellKey, Cell]:
    """Rows grouped by key, in first-seen order."""
    cells: dict[CellKey, Cell] = {}
    for row in rows:
        key = cell_key(row)
        cells.setdefault(key, Cell(key, [])).rows.append(row)
    return cells

