"""The seed's table for ``zcnet bench``: rows MTU, columns engine, one block per placement.

A cell reads ``Gbit/s (busy %)``: the rate received, and how busy the CPU the receiving application
ran on was (a legend under the tables says what that CPU also ran). A cell that did not run reads
``n/a`` and the reason goes in a note under the table (and in the JSON); `` !`` marks a cell with a
warning. A zcrx cell where the kernel copied into the area (copy mode, no NIC queue) reads ``copy``
after its numbers, with a note; a zero-copy engine's cell reads ``zc N%``, the share of its bytes
the kernel did not copy (``zc ?``: unknown, the reason in a note). A cell run several times
(``--repeat``) reads the medians of its repeats and, on a second line, their Gbit/s range
``[min..max]``; a third says how many failed, if any. With more engines than fit the terminal, the
table turns: rows engine, columns MTU (``transposed``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from rich.console import Console
from rich.table import Table
from rich.text import Text

from zcnet.bench.matrix import cell_groups, peer_ratios
from zcnet.bench.records import CpuPair, CpuShares, EngineStat, ResultFile, ResultRow
from zcnet.report.export import fits, print_notes, say
from zcnet.report.labels import PLACEMENT_TITLES, ZCRX_COPY_NOTE
from zcnet.report.warning_notes import cell_warnings

UNIT = "Gbit/s (CPU busy %)"


@dataclass
class Block:
    """One placement's table and the line printed above it (a rich title would wrap at the
    table's own width, however wide the terminal)."""

    title: str
    table: Table


def _busy(r: ResultRow) -> float | None:
    shares = r.side_shares("rx")
    return shares.busy if shares is not None else None


def _gbps(r: ResultRow) -> float:
    return r.gbps if r.gbps is not None else 0.0


def cell_text(r: ResultRow | None) -> Text:
    """``Gbit/s (busy %)``; a CPU share that was not sampled reads n/a, never 0%."""
    if r is None:
        return Text("-")
    if not r.ok:
        return Text("n/a" if r.status == "unsupported" else "error")
    busy = _busy(r)
    text = Text(f"{_gbps(r):.1f}")
    text.append(f" ({busy:.0f}%)" if busy is not None else " (CPU n/a)")
    if r.zcrx_mode == "copy":
        text.append(" copy")
    if r.tracks_copies():
        share = r.zero_copy_share()
        text.append(f" zc {share:.0f}%" if share is not None else " zc ?")
    if r.warnings:
        text.append(" !", style="yellow")
    if r.verify is not None and r.verify.mismatches:
        text.append(" MISMATCH", style="red")
    return text


def progress_text(r: ResultRow) -> str:
    """One finished cell in a line of progress; the reasons wait for the notes."""
    if not r.ok:
        reason = r.reason
        return f"{r.status}" + (f": {reason[:60]}…" if len(reason) > 60 else
                                f": {reason}" if reason else "")
    busy = _busy(r)
    return (f"{_gbps(r):.1f} Gbit/s, CPU " + (f"{busy:.0f}% busy" if busy is not None
                                               else "n/a")
            + (" (warning)" if r.warnings else ""))


def repeats_text(rows: list[ResultRow]) -> Text:
    """One cell over its repeats: ``cell_text`` of a row holding the medians (Gbit/s, busy %),
    then on a second line the Gbit/s range, and on a third how many repeats did not succeed."""
    ok = [r for r in rows if r.ok]
    if len(rows) == 1 or not ok:
        return cell_text(rows[0])
    busy = [b for r in ok if (b := _busy(r)) is not None]
    med = replace(
        ok[0], gbps=statistics.median(_gbps(r) for r in ok),
        warnings=next((r.warnings for r in ok if r.warnings), []),
        verify=next((r.verify for r in ok if r.verify is not None and r.verify.mismatches),
                    None),
        cpu=CpuPair(rx=CpuShares(busy=statistics.median(busy))) if busy else None,
        engine_stats=_median_share(ok))
    text = cell_text(med)
    if len(ok) > 1:
        text.append(f"\n[{min(_gbps(r) for r in ok):.1f}..{max(_gbps(r) for r in ok):.1f}]")
    if len(ok) < len(rows):
        text.append(f"\n{len(rows) - len(ok)}/{len(rows)} failed", style="red")
    return text


def _median_share(rows: list[ResultRow]) -> dict[str, EngineStat] | None:
    """The first row's engine stats with the median zero-copy share of the repeats (unknown
    when any repeat's is)."""
    stats = rows[0].engine_stats
    if stats is None or not rows[0].tracks_copies():
        return stats
    shares = [r.zero_copy_share() for r in rows]
    known = [v for v in shares if v is not None]
    median = statistics.median(known) / 100 if len(known) == len(shares) else None
    return {**stats, "zero_copy_share": median}


def bench_tables(doc: ResultFile, *, transposed: bool = False) -> list[Block]:
    """One block per placement: rows MTU and columns engine (as the seed), or ``transposed``."""
    results = doc.results
    engines = list(dict.fromkeys(r.engine or "" for r in results))
    cells = cell_groups(results)

    def text(mtu: int | None, engine: str, placement: str) -> Text:
        key = (mtu, engine, placement)
        return repeats_text(cells[key]) if key in cells else cell_text(None)

    blocks = []
    for placement in dict.fromkeys(r.placement or "" for r in results):
        mtus = list(dict.fromkeys(r.mtu for r in results if (r.placement or "") == placement))
        t = Table(title=None)
        if transposed:
            t.add_column("engine", no_wrap=True)
            for mtu in mtus:
                t.add_column(f"MTU {mtu}", justify="right", no_wrap=True)
            for e in engines:
                t.add_row(Text(str(e)), *(text(mtu, e, placement) for mtu in mtus))
        else:
            t.add_column("MTU", justify="right", no_wrap=True)
            for e in engines:
                t.add_column(Text(str(e)), justify="right")
            for mtu in mtus:
                t.add_row(str(mtu), *(text(mtu, e, placement) for e in engines))
        title = PLACEMENT_TITLES.get(placement, f"placement {placement}")
        blocks.append(Block(f"{UNIT} · {title}", t))
    return blocks


def bench_legend(doc: ResultFile) -> list[str]:
    """What a cell's numbers mean; the range line only when cells were repeated."""
    lines = ["cell: Gbit/s received (CPU busy %: of the CPU the receiving application ran on, "
             "100 - %idle - %iowait over the cell from /proc/stat; in placement same that CPU "
             "also runs the receive softirq, and in the lab the sender)"]
    if any(len(rows) > 1 for rows in cell_groups(doc.results).values()):
        lines.append("repeated cells: medians of the repeats; second line: lowest..highest "
                     "Gbit/s")
    marks = []
    if any(r.warnings for r in doc.results):
        marks.append("! a warning below")
    if any(r.zcrx_mode == "copy" for r in doc.results):
        marks.append("copy: zcrx in copy mode (note below)")
    if any(r.tracks_copies() for r in doc.results):
        marks.append("zc N%: of the bytes received, the share the kernel did not copy (its own "
                     "counter; the soft provider copies all: 0%); zc ?: unknown (note below)")
    if marks:
        lines.append("; ".join(marks))
    return lines


def bench_notes(doc: ResultFile) -> list[str]:
    """The run's warnings (busy machine, other labs), why cells did not run (one line per engine
    and reason), cell warnings once per cell, verify failures."""
    notes = [f"warning: {w}" for w in doc.warnings or []]
    if doc.complete is False:
        notes.append(f"incomplete: interrupted after {len(doc.results)} cells; the "
                     "missing cells were not measured")
    tx_notes: dict[str, None] = {}  # the sender's fallbacks (e.g. no SEND_ZC), once each
    not_run: dict[tuple[str, str, str], list[str]] = {}
    for (mtu, engine, placement), rows in cell_groups(doc.results).items():
        where = f"mtu {mtu} {placement}"
        for r in rows:
            if not r.ok:
                not_run.setdefault((r.status, engine, r.reason), []).append(where)
        ok = [r for r in rows if r.ok]
        notes += cell_warnings(f"{engine} {where}", ok)
        if ok and all(_busy(r) is None for r in ok):
            notes.append(f"CPU n/a: {engine} {where}: the receiving CPU's share was not "
                         "sampled")
        notes += list(dict.fromkeys(f"zc ?: {engine} {where}: zero-copy share unknown: {why}"
                                    for r in ok if (why := r.zero_copy_reason())))
        for r in ok:
            if r.tx_stats is not None and r.tx_stats.note:
                tx_notes.setdefault(r.tx_stats.note, None)
        for r in rows:
            if r.verify is not None and r.verify.mismatches:
                notes.append(f"verify: {engine} {where}: {r.verify.mismatches} of "
                             f"{r.verify.checked_bytes} bytes wrong")
    per_engine: dict[str, int] = {}
    for r in doc.results:
        per_engine[r.engine or ""] = per_engine.get(r.engine or "", 0) + 1
    for (status, engine, reason), cells in not_run.items():
        which = ("all cells" if len(cells) == per_engine[engine] > 1
                 else ", ".join(dict.fromkeys(cells)))  # once per cell, not per repeat
        notes.append(f"{status}: {engine} ({which}): {reason}")
    notes += [f"sender: {n}" for n in tx_notes]
    copied = list(dict.fromkeys(r.engine for r in doc.results if r.zcrx_mode == "copy"))
    notes += [f"{e} copy: {ZCRX_COPY_NOTE}" for e in copied]
    for p in peer_ratios(doc.results):
        notes.append(f"mtu {p.mtu} {p.placement}: best engine {p.engine} "
                     f"{p.gbps:.1f} Gbit/s = {p.ratio:.2f}x {p.peer} ({p.peer_gbps:.1f})")
    if not doc.env.lab:
        notes.append(doc.env.target_note() or "loopback, not a lab")
    return notes


def print_report(doc: ResultFile, console: Console) -> None:
    """The tables (turned when the engines do not fit across), the legend and the notes; text
    from results (reasons, host names) is printed literally."""
    blocks = bench_tables(doc)
    if not all(fits(console, b.table) for b in blocks):
        blocks = bench_tables(doc, transposed=True)
    for b in blocks:
        say(console, b.title, "bold")
        console.print(b.table)
    print_notes(console, [*bench_legend(doc), *bench_notes(doc)])
