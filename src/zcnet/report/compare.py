"""A/B comparison of two result files, cell by cell.

Two runs are only comparable on the same kernel, CPU model and NIC: a ratio across machines says
more about the machines than about the change under test, so that needs an explicit ``--force``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from zcnet.errors import UsageError, ZcnetError
from zcnet.report.cells import METRICS, CellKey, check_figures, group, key_text
from zcnet.report.stats import Summary, Verdict, summarize, welch
from zcnet.report.tables import Table, fmt_summary

ENV_MUST_MATCH = ("kernel", "cpu_model", "nic")


@dataclass(frozen=True)
class Row:
    key: CellKey
    metric: str
    a: Summary | None
    b: Summary | None
    verdict: Verdict | None
    note: str = ""


# What makes a NIC the same NIC: its driver, firmware and bus address, not the interface name
# (every lab's veth has a fresh one) nor settings recorded alongside.
NIC_IDENTITY = ("driver", "firmware", "bus_info")


def _identity(field: str, value: Any) -> Any:
    if field == "nic" and isinstance(value, dict):
        return tuple(value.get(k) for k in NIC_IDENTITY)
    return value


def env_differences(env_a: dict[str, Any], env_b: dict[str, Any]) -> list[str]:
    """Fields that differ. A NIC recorded on one side only is unknown, not different."""
    out = []
    for f in ENV_MUST_MATCH:
        a, b = _identity(f, env_a.get(f)), _identity(f, env_b.get(f))
        if f == "nic" and (a is None or b is None):
            continue
        if a != b:
            out.append(f"{f}: {_show(a)} vs {_show(b)}")
    return out


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(str(v) for v in value if v) or "?"
    return repr(value)


def check_comparable(doc_a: dict[str, Any], doc_b: dict[str, Any], *, force: bool) -> list[str]:
    """The env differences; raises unless ``force``."""
    for side, doc in (("A", doc_a), ("B", doc_b)):
        if doc.get("tool") != "zcnet" or not isinstance(doc.get("results"), list):
            raise UsageError("not a zcnet result file (no zcnet envelope)",
                             "pass files written by --json or --out")
        check_figures(doc, side)
    kind_a, kind_b = kind_of(doc_a), kind_of(doc_b)
    if kind_a != kind_b:
        raise UsageError(f"different kinds of runs: A is {kind_a}, B is {kind_b}",
                         "compare two results of one command or experiment")
    diffs = env_differences(doc_a.get("env", {}), doc_b.get("env", {}))
    if diffs and not force:
        raise ZcnetError("runs were measured on different systems: " + "; ".join(diffs),
                         "compare runs from one machine, or pass --force")
    return diffs


def kind_of(doc: dict[str, Any]) -> str:
    """What a result file measured: its command, and the experiment's tool for experiments."""
    kind = str(doc.get("kind", "?"))
    tool = (doc.get("experiment") or {}).get("tool") if isinstance(doc.get("experiment"),
                                                                   dict) else None
    return f"{kind} ({tool})" if tool else kind


def pick_metric(rows: list[dict[str, Any]]) -> str | None:
    """The headline metric of a cell: the first known metric its rows carry."""
    for name in METRICS:
        if any(isinstance(r.get(name), (int, float)) for r in rows):
            return name
    return None


def compare(doc_a: dict[str, Any], doc_b: dict[str, Any], *, force: bool = False,
            metric: str | None = None) -> list[Row]:
    check_comparable(doc_a, doc_b, force=force)
    if metric is not None and metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}", "choose one of: " + ", ".join(METRICS))
    cells_a, cells_b = group(doc_a["results"]), group(doc_b["results"])
    out: list[Row] = []
    for key in list(cells_a) + [k for k in cells_b if k not in cells_a]:
        ca, cb = cells_a.get(key), cells_b.get(key)
        name = metric or pick_metric((ca.rows if ca else []) + (cb.rows if cb else []))
        if name is None:
            sides = {side: f"{c.status}" + (f" ({c.reason})" if c.reason else "")
                     for side, c in (("A", ca), ("B", cb)) if c is not None}
            if len(set(sides.values())) == 1 and len(sides) == 2:
                why = f"both {sides['A']}"
            else:
                why = "; ".join(f"{side}: {text}" for side, text in sides.items())
            out.append(Row(key, "", None, None, None, why or "no metric"))
            continue
        va = ca.values(name) if ca else []
        vb = cb.values(name) if cb else []
        sa = summarize(va) if va else None
        sb = summarize(vb) if vb else None
        if not va or not vb:
            side = "A" if not va else "B"
            cell = ca if not va else cb
            why = cell.reason if cell else ""
            note = f"only in {'B' if not ca else 'A'}" if (ca is None or cb is None) else \
                f"no result in {side}" + (f": {why}" if why else "")
            out.append(Row(key, name, sa, sb, None, note))
            continue
        verdict = welch(va, vb, higher_is_better=METRICS[name].higher_is_better)
        out.append(Row(key, name, sa, sb, verdict))
    return out


def row_dict(row: Row) -> dict[str, Any]:
    """A JSON-ready form of a comparison row."""
    return {
        "cell": dict(row.key),
        "cell_text": key_text(row.key),
        "metric": row.metric,
        "a": row.a.as_dict() if row.a else None,
        "b": row.b.as_dict() if row.b else None,
        "ratio": row.verdict.ratio if row.verdict else None,
        "pvalue": row.verdict.pvalue if row.verdict else None,
        "verdict": row.verdict.text() if row.verdict else row.note,
    }


def compare_table(rows: list[Row], name_a: str = "A", name_b: str = "B",
                  diffs: list[str] | None = None) -> Table:
    t = Table(f"B ({name_b}) vs A ({name_a})", ["cell", "metric", "A", "B", "B/A", "verdict"],
              [])
    for r in rows:
        ok = r.verdict is not None and not math.isnan(r.verdict.ratio)
        ratio = f"{r.verdict.ratio:.2f}x" if ok and r.verdict else ""
        t.rows.append([key_text(r.key), r.metric, fmt_summary(r.a, r.metric) if r.metric else "",
                       fmt_summary(r.b, r.metric) if r.metric else "", ratio,
                       r.verdict.text() if r.verdict else r.note])
    if diffs:
        t.notes.append("warning: compared despite different systems (--force): "
                       + "; ".join(diffs))
    t.notes += unstable_sides(rows)
    return t


def incomplete_notes(doc_a: dict[str, Any], doc_b: dict[str, Any]) -> list[str]:
    """A warning for each side whose run was interrupted before it measured every cell."""
    return [f"incomplete: {side} was interrupted; cells it did not reach read 'only in'"
            for side, doc in (("A", doc_a), ("B", doc_b)) if doc.get("complete") is False]


def unstable_sides(rows: list[Row]) -> list[str]:
    """Instability warnings for either side: a ratio of unstable numbers needs more repeats."""
    out = []
    for r in rows:
        for side, s in (("A", r.a), ("B", r.b)):
            if s is not None and s.unstable:
                out.append(f"warning: {key_text(r.key)}: {side} unstable (stdev "
                           f"{100 * s.stdev / abs(s.mean):.0f}% of mean); use more --repeat")
    return out
