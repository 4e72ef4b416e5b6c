"""A/B comparison of two result files, cell by cell.

Two runs are only comparable on the same kernel, CPU model and NIC: a ratio across machines says
more about the machines than about the change under test, so that needs an explicit ``--force``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zcnet.errors import UsageError, ZcnetError
from zcnet.report.cells import METRICS, CellKey, group, key_text
from zcnet.report.stats import Summary, Verdict, summarize, welch

ENV_MUST_MATCH = ("kernel", "cpu_model", "nic")


@dataclass(frozen=True)
class Row:
    key: CellKey
    metric: str
    a: Summary | None
    b: Summary | None
    verdict: Verdict | None
    note: str = ""


def env_differences(env_a: dict[str, Any], env_b: dict[str, Any]) -> list[str]:
    return [f"{f}: {env_a.get(f)!r} vs {env_b.get(f)!r}" for f in ENV_MUST_MATCH
            if env_a.get(f) != env_b.get(f)]


def check_comparable(doc_a: dict[str, Any], doc_b: dict[str, Any], *, force: bool) -> list[str]:
    """The env differences; raises unless ``force``."""
    for doc in (doc_a, doc_b):
        if doc.get("tool") != "zcnet" or not isinstance(doc.get("results"), list):
            raise UsageError("not a zcnet result file (no zcnet envelope)",
                             "pass files written by --json or --out")
    diffs = env_differences(doc_a.get("env", {}), doc_b.get("env", {}))
    if diffs and not force:
        raise ZcnetError("runs were measured on different systems: " + "; ".join(diffs),
                         "compare runs from one machine, or pass --force")
    return diffs


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
            out.append(Row(key, "", None, None, None, "no metric"))
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
