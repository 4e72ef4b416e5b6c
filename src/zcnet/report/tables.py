"""Experiment tables as plain data: a title, headers, string rows and notes.

Every output (rich in the terminal, Markdown, CSV) renders the same ``Table``, so what the terminal
shows and what a report file holds never disagree. The shapes follow the seeds: a grid (rows MTU,
columns engine), an A/B list against a baseline (Mpps ± stdev, per-packet costs), and an
mpstat-style per-CPU table.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from zcnet.bench.cpustat import SHARES
from zcnet.bench.records import AxisValue, CpuShares, ReportSection, ResultFile, ResultRow
from zcnet.errors import ZcnetError
from zcnet.report.cells import METRICS, Cell, CellKey, cell_key, group, key_text, metric_reason
from zcnet.report.labels import ZCRX_COPY_NOTE
from zcnet.report.stats import UNSTABLE_SHARE, Summary, welch
from zcnet.report.warning_notes import notes_for

MPSTAT_COLUMNS = tuple((k, f"%{k}") for k in SHARES)
RARE_SHARES = ("nice", "steal", "guest")


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    compact: bool = False  # no vertical lines nor edge padding: more room in 80 columns


def result_text(rows: list[ResultRow], metric: str) -> str:
    """One measured cell in a line of progress: its metric, or why it has none."""
    cell = Cell(cell_key(rows[0]), rows)
    if cell.status != "ok":
        return f"{cell.status}" + (f": {cell.reason}" if cell.reason else "")
    return fmt_summary(cell.summary(metric), metric)


def fmt_summary(s: Summary | None, metric: str) -> str:
    if s is None:
        return "n/a"
    m = METRICS[metric]
    text = s.format(m.digits)
    return f"{text} {m.unit}".rstrip() if m.unit and m.unit != "%" else text + m.unit


def unstable_notes(cells: Iterable[Cell], metrics: Iterable[str]) -> list[str]:
    notes = []
    for cell in cells:
        for metric in metrics:
            s = cell.summary(metric)
            if s is not None and s.unstable:
                share = 100 * s.stdev / abs(s.mean)
                notes.append(f"warning: {key_text(cell.key)}: {metric} unstable (stdev {share:.0f}%"
                             f" of mean, limit {100 * UNSTABLE_SHARE:.0f}%); rerun with more"
                             " --repeat or on a quieter machine")
    return notes


def warning_notes(cells: Iterable[Cell]) -> list[str]:
    """Each cell's warnings (the softirq ran where the placement said it would not, the rate
    wandered ...), once per cell."""
    return notes_for((key_text(c.key), c.rows) for c in cells)


def na_notes(cells: Iterable[Cell]) -> list[str]:
    return [f"n/a: {key_text(c.key)}: {c.status}" + (f": {c.reason}" if c.reason else "")
            for c in cells if c.status != "ok"]


def _cell_text(cell: Cell | None, metric: str, extra: Iterable[str]) -> str:
    """The metric's mean ± stdev without its unit (the table's title has it), then extras."""
    if cell is None:
        return "-"
    if cell.status != "ok":
        return "n/a"
    s = cell.summary(metric)
    parts = [s.format(METRICS[metric].digits) if s else "n/a"]
    for name in extra:
        if name == ZERO_COPY and not any(r.tracks_copies() for r in cell.rows):
            continue  # a copying engine: no counter to show
        s = cell.summary(name)
        m = METRICS[name]
        if s is not None:
            # Extras read as the seed's "CPU usage 95%": the mean only, the headline keeps the ±.
            unit = m.unit if m.unit == "%" else f" {m.unit}" if m.unit else ""
            parts.append(f"{s.mean:.{m.digits}f}{unit} {m.short or m.label}")
        else:  # not measured: never shown as 0
            parts.append(f"{'unknown' if name == ZERO_COPY else 'n/a'} {m.short or m.label}")
    return ", ".join(parts)


ZERO_COPY = "zero_copy_share"


def with_copies(extra: list[str], rows: Iterable[ResultRow]) -> list[str]:
    """``extra`` and the zero-copy share where a receiver kept the kernel's copy counters."""
    if ZERO_COPY in extra or not any(r.tracks_copies() for r in rows):
        return extra
    return [*extra, ZERO_COPY]


def copy_notes(cells: Iterable[Cell]) -> list[str]:
    """Why a zero-copy share is unknown: one line per reason, naming its cells."""
    by_reason: dict[str, dict[str, None]] = {}
    for c in cells:
        for r in c.rows:
            if r.ok and (why := r.zero_copy_reason()):
                by_reason.setdefault(why, {})[key_text(c.key)] = None
    return [f"zero-copy unknown ({'; '.join(keys)}): {why}" for why, keys in by_reason.items()]


def _blocks(cells: dict[CellKey, Cell], fixed: Iterable[str]) -> dict[CellKey, list[Cell]]:
    """Cells split by the values of the axes that are neither rows nor columns."""
    fixed = set(fixed)
    out: dict[CellKey, list[Cell]] = {}
    for cell in cells.values():
        rest = tuple((f, v) for f, v in cell.key if f not in fixed and f != "experiment")
        out.setdefault(rest, []).append(cell)
    return out


def grid(title: str, results: list[ResultRow], *, rows: str, columns: str, metric: str,
         extra: Iterable[str] = ()) -> list[Table]:
    """One table per combination of the other axes: rows x columns, cell = metric (+ extras)."""
    cells = group(results)
    tables = []
    for rest, block in _blocks(cells, (rows, columns)).items():
        extra = with_copies(list(extra), (r for c in block for r in c.rows))
        row_vals = list(dict.fromkeys(c.fields.get(rows) for c in block))
        col_vals = list(dict.fromkeys(c.fields.get(columns) for c in block))
        lookup = {(c.fields.get(rows), c.fields.get(columns)): c for c in block}
        suffix = ", ".join(f"{f} {v}" for f, v in rest)
        # Engines name themselves (as in the seed's "epoll | io_uring"); other axes need a name.
        heads = [_engine_head(c, block, columns) if columns == "engine" else f"{columns} {c}"
                 for c in col_vals]
        m = METRICS[metric]
        what = f"{m.label} in {m.unit}, mean ± stdev" if m.unit else f"{m.label}, mean ± stdev"
        t = Table(f"{title} ({suffix}): {what}" if suffix else f"{title}: {what}",
                  [rows.upper() if rows == "mtu" else rows, *heads], [])
        for r in row_vals:
            t.rows.append([str(r), *(_cell_text(lookup.get((r, c)), metric, extra)
                                     for c in col_vals)])
        t.notes = (extra_legend(extra) + na_notes(block) + copy_notes(block)
                   + warning_notes(block)
                   + unstable_notes(block, [metric, *extra])
                   + [ZCRX_COPY_NOTE] * any(_modes(c) == {"copy"} for c in block))
        tables.append(t)
    return tables


# What an extra after the headline means, where a number alone would not say.
EXTRA_LEGENDS = {"rx_busy": "N% CPU: how busy the CPU the receiving application ran on was "
                            "(100 - %idle - %iowait over the cell); in placement same it also "
                            "runs the receive softirq (and in the lab the sender)",
                 ZERO_COPY: "N% zero-copy: of the bytes received, the share the kernel did not "
                            "copy, from its own counter (zcrx stats, devmem's linear "
                            "fragments; the soft provider copies every byte: 0%)"}


def extra_legend(extra: Iterable[str]) -> list[str]:
    return [EXTRA_LEGENDS[e] for e in extra if e in EXTRA_LEGENDS]


def _modes(cell: Cell) -> set[str]:
    return {r.zcrx_mode for r in cell.rows if r.zcrx_mode}


def _engine_head(engine: AxisValue | None, block: list[Cell], columns: str) -> str:
    """An engine column's heading; zcrx cells say whether the kernel copied (copy mode)."""
    modes = set().union(*(_modes(c) for c in block if c.fields.get(columns) == engine))
    return f"{engine} ({'/'.join(sorted(modes))} mode)" if modes else str(engine)


def ab(title: str, results: list[ResultRow], *, baseline: dict[str, AxisValue], metric: str,
       extra: Iterable[str] = ()) -> Table:
    """Each cell against the baseline cell: metric ± stdev, extras, ratio and verdict."""
    extra = with_copies(list(extra), results)
    cells = list(group(results).values())
    base = next((c for c in cells if all(c.fields.get(k) == v for k, v in baseline.items())),
                None)
    shown_extra = [e for e in extra if any(c.values(e) for c in cells)]
    label_axes = [f for f in dict.fromkeys(f for c in cells for f, _ in c.key)
                  if f != "experiment" and len({c.fields.get(f) for c in cells}) > 1]
    headers = ["/".join(label_axes) or "cell", METRICS[metric].label,
               *(METRICS[e].label for e in shown_extra), "vs baseline"]
    t = Table(title, headers, [])
    missing = [e for e in extra if e not in shown_extra]
    for cell in cells:
        label = "/".join(str(cell.fields.get(f)) for f in label_axes) or key_text(cell.key)
        if cell.status != "ok":
            t.rows.append([label, "n/a", *("n/a" for _ in shown_extra), cell.status])
            continue
        row = [label, fmt_summary(cell.summary(metric), metric),
               *(fmt_summary(cell.summary(e), e) for e in shown_extra)]
        if cell is base:
            row.append("baseline")
        elif base is None or not base.values(metric):
            row.append("no baseline")
        else:
            row.append(_vs_baseline(base.values(metric), cell.values(metric), metric))
        t.rows.append(row)
    if missing:
        reason = next((why.removeprefix("n/a: ") for r in results for m in missing
                       if (why := metric_reason(r, m))), "not measured")
        t.notes.append("n/a: " + ", ".join(METRICS[m].label for m in missing) + f": {reason}")
    t.notes += extra_legend(shown_extra) if ZERO_COPY in shown_extra else []
    t.notes += na_notes(cells) + copy_notes(cells) + warning_notes(cells) + unstable_notes(cells,
                                                                    [metric, *shown_extra])
    return t


def _vs_baseline(base: list[float], vals: list[float], metric: str) -> str:
    if not vals:
        return "n/a"  # an ok cell that lacks this metric: nothing to compare
    higher = METRICS[metric].higher_is_better
    try:
        v = welch(base, vals, higher_is_better=higher)
    except ZcnetError:
        # Without scipy a table still shows the ratio; only the verdict needs the t-test.
        mb, mv = sum(base) / len(base), sum(vals) / len(vals)
        if mb == 0 or mv == 0:
            return "no ratio: a mean is 0 (no verdict: scipy not installed)"
        ratio = mv / mb
        return f"{ratio if higher else 1 / ratio:.2f}x (no verdict: scipy not installed)"
    if v.significant:
        return v.text()
    if math.isnan(v.ratio):
        return f"no ratio: a mean is 0, {v.text()}"
    return f"{v.ratio:.2f}x, {v.text()}"


def per_cpu_shares(cell: Cell) -> dict[str, CpuShares]:
    """Mean per-CPU shares over the cell's repeats (CPU ids as strings, as JSON keeps them); a
    share no repeat recorded (a file from before it was measured) is None: n/a, not 0."""
    acc: dict[str, list[CpuShares]] = {}
    for row in cell.rows:
        for cpu, shares in (row.cpus or {}).items():
            if shares.sampled:  # an unsampled CPU has no shares: n/a, not 0%
                acc.setdefault(cpu, []).append(shares)
    return {cpu: CpuShares(**{k: _mean_share(lst, k) for k, _ in MPSTAT_COLUMNS})
            for cpu, lst in sorted(acc.items(), key=lambda kv: int(kv[0]))}


def _mean_share(samples: list[CpuShares], key: str) -> float | None:
    vals = [v for s in samples if (v := s.share(key)) is not None]
    return sum(vals) / len(vals) if vals else None


def mpstat_columns(rows: Iterable[CpuShares | None]) -> list[tuple[str, str]]:
    """The share columns worth a place: all but %nice, %steal and %guest, which show only where
    some CPU spent time there (a VM's stolen time, a niced process, a guest it runs)."""
    shares = [r for r in rows if r is not None and r.sampled]
    return [(k, h) for k, h in MPSTAT_COLUMNS
            if k not in RARE_SHARES or any(r.share(k) for r in shares)]


def mpstat_legend(columns: list[tuple[str, str]], shares: list[CpuShares]) -> str:
    """What the share columns are, and the rare ones left out: 0 everywhere, or not recorded
    (a file written before they were)."""
    hidden = [(k, h) for k, h in MPSTAT_COLUMNS if (k, h) not in columns]
    groups: dict[str, list[str]] = {}
    for k, h in hidden:
        recorded = [sh.share(k) is not None for sh in shares]
        why = ("0 on every CPU" if all(recorded) else "0 wherever recorded" if any(recorded)
               else "not recorded in this file")
        groups.setdefault(why, []).append(h)
    text = ("% of each CPU's time over the measured interval (/proc/stat, as mpstat); the "
            "shares add up to 100")
    return text + "".join(f"; {', '.join(hs)}: {why}, not shown" for why, hs in groups.items())


def fmt_share(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def mpstat(title: str, cell: Cell, metric: str = "mbps",
           columns: list[tuple[str, str]] | None = None) -> Table:
    """The seed's per-CPU table for one cell, headed by its throughput."""
    s = cell.summary(metric)
    value = fmt_summary(s, metric) if s else "n/a"
    shares = per_cpu_shares(cell)
    columns = columns or mpstat_columns(shares.values())
    t = Table(f"{title}: {key_text(cell.key)}: {value}", ["CPU", *(h for _, h in columns)], [])
    for cpu, sh in shares.items():
        t.rows.append([cpu, *(fmt_share(sh.share(k)) for k, _ in columns)])
    if not t.rows:
        t.notes.append("no per-CPU accounting recorded for this cell")
    first = cell.rows[0]
    if (app := first.shares_cpu("rx")) is not None:
        where = f"application on CPU {app}, sender on CPU {first.shares_cpu('tx')}"
        if first.rx_cpu_end is not None and first.rx_cpu_end >= 0:
            where += f", receive softirq on CPU {first.rx_cpu_end} (SO_INCOMING_CPU)"
        t.notes.append(where)
    return t


def per_cpu_tables(title: str, cells: list[Cell], metric: str) -> list[Table]:
    """``mpstat`` of each cell, all with the same columns, the legend under the last."""
    shares = [sh for c in cells for sh in per_cpu_shares(c).values()]
    columns = mpstat_columns(shares)
    tables = [mpstat(title, c, metric, columns) for c in cells]
    if tables and shares:
        tables[-1].notes.append(mpstat_legend(columns, shares))
    return tables


# How to show envelopes that carry no ``report`` section of their own.
DEFAULT_REPORTS: dict[str, ReportSection] = {
    "bench": ReportSection(table="grid", rows="mtu", columns="engine", metric="gbps",
                           extra=["rx_busy"], plots=["throughput-vs-mtu", "cpu-breakdown"]),
    "txbench": ReportSection(table="ab", baseline={"mode": "single"}, metric="mpps",
                             extra=["ns_per_pkt", "instructions_per_pkt", "cycles_per_pkt"],
                             plots=["pps-per-mode"]),
}


def report_section(doc: ResultFile) -> ReportSection:
    return doc.report or DEFAULT_REPORTS.get(doc.kind, DEFAULT_REPORTS["bench"])


def experiment_tables(doc: ResultFile) -> list[Table]:
    """All tables of an envelope, as its ``report`` section (or its kind's default) asks."""
    rep = report_section(doc)
    exp = doc.experiment
    results = doc.rows()
    title = (exp.title or exp.name if exp else "") or doc.kind or "results"
    metric, extra = rep.metric, rep.extra
    if rep.table == "ab":
        tables = [ab(title, results, baseline=rep.baseline, metric=metric, extra=extra)]
    elif rep.table == "grid":
        tables = grid(title, results, rows=rep.rows or "mtu", columns=rep.columns or "engine",
                      metric=metric, extra=extra)
    else:
        tables = []
    if rep.per_cpu or rep.table == "mpstat":
        tables += per_cpu_tables(exp.name if exp and exp.name else title,
                                 [c for c in group(results).values() if c.status == "ok"], metric)
    peers = doc.rows(peers=True)
    if peers:
        tables.append(peer_table(results, peers, metric))
    subs = [f"substituted: {s.text}" for s in (exp.substitutions if exp else [])]
    subs += [f"warning: {w}" for w in doc.warnings or []]
    if doc.complete is False:
        subs.insert(0, f"incomplete: the run was interrupted after {len(doc.results)}"
                       " measured rows; cells it did not reach are missing")
        if not tables:
            tables = [Table(title, [], [])]
    if tables and subs:
        tables[0].notes = subs + tables[0].notes
    return tables


def peer_table(results: list[ResultRow], peers: list[ResultRow], metric: str) -> Table:
    """Each peer tool per MTU and placement over its repeats (median and range) against the best
    zcnet cell there (its median), with the ratio of the medians."""
    m = METRICS[metric]
    t = Table(f"peers in the same lab, placement and duration ({m.label} in {m.unit}: median "
              "of the runs, [lowest..highest])",
              ["peer", "MTU", "placement", m.label, "best zcnet", "zcnet/peer"], [])
    zc = [c for c in group(results).values() if c.values(metric)]
    runs: dict[tuple[str, int | None, str | None], list[ResultRow]] = {}
    for p in peers:
        runs.setdefault((p.peer or "", p.mtu, p.placement), []).append(p)
    for (peer, mtu, placement), rows in runs.items():
        head = [str(peer), str(mtu if mtu is not None else ""), str(placement or "")]
        vals = Cell((), rows).values(metric)
        if not vals:
            why = next((r.reason or r.status for r in rows), "n/a")
            t.rows.append([*head, "n/a", "", ""])
            t.notes.append(f"n/a: {peer} mtu {mtu} {placement}: {why}")
            continue
        same = [c for c in zc if c.fields.get("mtu", mtu) == mtu
                and c.fields.get("placement", placement) == placement]
        best = max(same, key=lambda c: statistics.median(c.values(metric)), default=None)
        mine = statistics.median(best.values(metric)) if best else None
        theirs = statistics.median(vals)
        name = str(best.fields.get("engine") or key_text(best.key)) if best else ""
        t.rows.append([*head, _median_range(vals, m.digits),
                       f"{name} {mine:.{m.digits}f}" if mine is not None else "n/a",
                       f"{mine / theirs:.2f}x" if mine is not None and theirs else "n/a"])
        if len(vals) < len(rows):
            t.notes.append(f"warning: {peer} mtu {mtu} {placement}: {len(rows) - len(vals)} of "
                           f"{len(rows)} runs failed")
    return t


def _median_range(vals: list[float], digits: int) -> str:
    mid = f"{statistics.median(vals):.{digits}f}"
    if len(vals) < 2:
        return mid
    return f"{mid} [{min(vals):.{digits}f}..{max(vals):.{digits}f}]"


CsvValue = str | int | float


def flat_rows(results: list[ResultRow]) -> tuple[list[str], list[list[CsvValue]]]:
    """Cells as flat records (for CSV): key fields, status, then mean/stdev/min/max/n per metric."""
    cells = list(group(results).values())
    keys = list(dict.fromkeys(f for c in cells for f, _ in c.key))
    metrics = [m for m in METRICS if any(c.values(m) for c in cells)]
    headers = [*keys, "status", "reason",
               *itertools.chain.from_iterable(
                   (f"{m}_mean", f"{m}_stdev", f"{m}_min", f"{m}_max", f"{m}_n")
                   for m in metrics)]
    out = []
    for c in cells:
        rec: list[CsvValue] = [*(c.fields.get(k, "") for k in keys), c.status, c.reason]
        for m in metrics:
            s = c.summary(m)
            rec += [round(s.mean, 6), round(s.stdev, 6), s.min, s.max, s.n] if s else [""] * 5
        out.append(rec)
    return headers, out
