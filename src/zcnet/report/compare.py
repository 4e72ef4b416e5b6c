"""A/B comparison of two result files, cell by cell.

Two runs are only comparable on the same kernel, CPU model and NIC: a ratio across machines says
more about the machines than about the change under test, so that needs an explicit ``--force``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from zcnet.bench.records import AxisValue, ComparisonRow, Env, ResultFile, ResultRow, Stats
from zcnet.errors import UsageError, ZcnetError
from zcnet.jsonvalue import JSONValue
from zcnet.report.cells import METRICS, CellKey, group, key_text, stored_metric
from zcnet.report.stats import UNSTABLE_SHARE, Summary, Verdict, summarize, welch
from zcnet.report.tables import Table

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


Identity = JSONValue | tuple[JSONValue, ...]


def _identity(env: Env, field: str) -> Identity:
    """What must match of an env's ``field``: a NIC's driver, firmware and bus address."""
    value = {"kernel": env.kernel, "cpu_model": env.cpu_model, "nic": env.nic}[field]
    if field == "nic" and isinstance(value, dict):
        return tuple(value.get(k) for k in NIC_IDENTITY)
    return value


def env_differences(env_a: Env, env_b: Env) -> list[str]:
    """Fields that differ. A NIC recorded on one side only is unknown, not different."""
    out = []
    for f in ENV_MUST_MATCH:
        a, b = _identity(env_a, f), _identity(env_b, f)
        if f == "nic" and (a is None or b is None):
            continue
        if a != b:
            out.append(f"{f}: {_show(a)} vs {_show(b)}")
    return out


def _show(value: Identity) -> str:
    if isinstance(value, tuple):
        return "/".join(str(v) for v in value if v) or "?"
    return repr(value)


def check_comparable(doc_a: ResultFile, doc_b: ResultFile, *, force: bool) -> list[str]:
    """The env differences; raises unless ``force``."""
    kind_a, kind_b = kind_of(doc_a), kind_of(doc_b)
    if kind_a != kind_b:
        raise UsageError(f"different kinds of runs: A is {kind_a}, B is {kind_b}",
                         "compare two results of one command or experiment")
    diffs = env_differences(doc_a.env, doc_b.env)
    if diffs and not force:
        raise ZcnetError("runs were measured on different systems: " + "; ".join(diffs),
                         "compare runs from one machine, or pass --force")
    return diffs


def kind_of(doc: ResultFile) -> str:
    """What a result file measured: its command, and the experiment's tool for experiments."""
    tool = doc.experiment.tool if doc.experiment is not None else ""
    return f"{doc.kind} ({tool})" if tool else doc.kind


def pick_metric(rows: list[ResultRow]) -> str | None:
    """The headline metric of a cell: the first known metric its rows carry."""
    for name in METRICS:
        if any(stored_metric(r, name) is not None for r in rows):
            return name
    return None


def compare(doc_a: ResultFile, doc_b: ResultFile, *, force: bool = False,
            metric: str | None = None) -> list[Row]:
    check_comparable(doc_a, doc_b, force=force)
    if metric is not None and metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}", "choose one of: " + ", ".join(METRICS))
    cells_a, cells_b = group(doc_a.results), group(doc_b.results)
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


def _stats(s: Summary | None) -> Stats | None:
    if s is None:
        return None
    return Stats(n=s.n, mean=s.mean, stdev=s.stdev, min=s.min, max=s.max, unstable=s.unstable)


def comparison_row(row: Row) -> ComparisonRow:
    """A comparison row as the result file keeps it; a ratio without a value (a mean of 0) is
    null, not NaN, which JSON does not have."""
    ratio = row.verdict.ratio if row.verdict else None
    return ComparisonRow(
        cell=dict(row.key), cell_text=key_text(row.key), metric=row.metric, a=_stats(row.a),
        b=_stats(row.b), ratio=None if ratio is None or math.isnan(ratio) else ratio,
        pvalue=row.verdict.pvalue if row.verdict else None,
        verdict=row.verdict.text() if row.verdict else row.note)


def _short_verdict(row: Row) -> str:
    """The verdict column: faster/slower/n.s. with the p-value; why there is none otherwise."""
    v = row.verdict
    if v is None:
        return row.note if row.note.startswith("only in") else "n/a"
    if v.pvalue is None:
        return "no verdict" if "--repeat" in v.reason else v.reason
    p = "p<0.001" if v.pvalue < 0.001 else f"p={v.pvalue:.3f}"
    if not v.significant:
        return f"n.s. {p}"
    if math.isnan(v.ratio):
        return v.text()
    return f"{'faster' if v.ratio >= 1 else 'slower'} {p}"


def _axes(keys: list[CellKey]) -> tuple[list[str], list[tuple[str, AxisValue]]]:
    """The key fields whose values differ between cells (the cell column), and those with one
    value wherever present (said once). A cell that failed before it recorded, say, its send
    path lacks that field: missing is not a value."""
    fields = list(dict.fromkeys(f for k in keys for f, _ in k))
    values = {f: {v for k in keys for g, v in k if g == f} for f in fields}
    varying = [f for f in fields if len(values[f]) > 1]
    same = [(f, next(iter(values[f]))) for f in fields if len(values[f]) == 1]
    return varying, same


def compare_table(rows: list[Row], name_a: str = "A", name_b: str = "B",
                  diffs: list[str] | None = None) -> list[Table]:
    """One table per metric: a row per cell with A and B (mean ± stdev), B/A and the Welch
    verdict. Made to read at 80 columns: the unit is in the title, the cell names only what
    differs between cells (the rest is said once), the verdict is a word and a p-value; cells
    without a result on either side, reasons and warnings are notes, once per reason."""
    varying, same = _axes([r.key for r in rows])

    def label(r: Row) -> str:
        return " ".join(str(dict(r.key).get(f, "-")) for f in varying) or key_text(r.key)

    cell_line = ("\ncell: " + " ".join(varying) + (" (all cells: " + ", ".join(
        f"{f} {v}" for f, v in same) + ")" if same else "")) if varying else ""
    head = ["verdict: Welch's t-test of B against A at p < 0.05 (n.s.: not significant); "
                "B/A > 1 means B is better"]
    if diffs:
        head.append("warning: compared despite different systems (--force): " + "; ".join(diffs))
    unmeasured: dict[str, list[str]] = {}
    for r in rows:
        if not r.metric:
            unmeasured.setdefault(r.note, []).append(label(r))
    tail = [f"not measured: {', '.join(cells)}: {note}" for note, cells in unmeasured.items()]
    tables = []
    for metric in dict.fromkeys(r.metric for r in rows if r.metric):
        m = METRICS[metric]
        what = f"{m.label} in {m.unit}, mean ± stdev" if m.unit else f"{m.label}, mean ± stdev"
        t = Table(f"B ({name_b}) vs A ({name_a}): {what}{cell_line}",
                  ["cell", "A", "B", "B/A", "verdict"], [], compact=True)
        why: dict[str, list[str]] = {}
        block = [r for r in rows if r.metric == metric]
        for r in block:
            ok = r.verdict is not None and not math.isnan(r.verdict.ratio)
            t.rows.append([label(r), _number(r.a, metric), _number(r.b, metric),
                           f"{r.verdict.ratio:.2f}x" if ok and r.verdict else "",
                           _short_verdict(r)])
            if r.verdict is None and r.note and not r.note.startswith("only in"):
                why.setdefault(r.note, []).append(label(r))
        t.notes += [f"n/a: {', '.join(cells)}: {note}" for note, cells in why.items()]
        if any(row[-1] == "no verdict" for row in t.rows):
            t.notes.append("no verdict: a side ran the cell once; a t-test needs --repeat 2 or "
                           "more on both sides")
        t.notes += unstable_sides(block, label)
        tables.append(t)
    if not tables:
        tables.append(Table(f"B ({name_b}) vs A ({name_a}): no cell measured on either side",
                            [], [], compact=True))
    tables[0].notes[:0] = head
    tables[-1].notes += tail
    return tables


def _number(s: Summary | None, metric: str) -> str:
    """A summary without its unit (the title has it)."""
    if s is None or not metric:
        return "n/a"
    return s.format(METRICS[metric].digits)


def incomplete_notes(doc_a: ResultFile, doc_b: ResultFile) -> list[str]:
    """A warning for each side whose run was interrupted before it measured every cell."""
    return [f"incomplete: {side} was interrupted; cells it did not reach read 'only in'"
            for side, doc in (("A", doc_a), ("B", doc_b)) if doc.complete is False]


def unstable_sides(rows: list[Row], label: Callable[[Row], str] | None = None) -> list[str]:
    """Instability warnings, one per cell naming the side(s): a ratio of unstable numbers needs
    more repeats."""
    out = []
    for r in rows:
        sides = [f"{side} {100 * s.stdev / abs(s.mean):.0f}%" for side, s in (("A", r.a),
                                                                            ("B", r.b))
                 if s is not None and s.unstable]
        if sides:
            name = label(r) if label else key_text(r.key)
            out.append(f"warning: {name}: unstable, stdev {' and '.join(sides)} of the mean "
                       f"(limit {100 * UNSTABLE_SHARE:.0f}%); use more --repeat")
    return out
