"""The seed's table for ``zcnet bench``: rows MTU, columns engine, one block per placement.

A cell reads ``Gbit/s (busy %)``: the rate received, and how busy the CPU the receiving
application ran on was (a legend under the tables says what that CPU also ran). A cell that did
not run reads ``n/a`` and the reason goes in a note under the table (and in the JSON); `` !``
marks a cell with a warning. A zcrx cell where the kernel copied into the area (copy mode, no NIC
queue) reads ``copy`` after its numbers, with a note. A cell run several times (``--repeat``)
reads the medians of its repeats and, on a second line, their Gbit/s range ``[min..max]``; a
third says how many failed, if any. With more engines than fit the terminal, the table turns: rows
engine, columns MTU (``transposed``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from zcnet.bench.matrix import cell_groups, peer_ratios
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


def _busy(r: dict[str, Any]) -> float | None:
    busy = ((r.get("cpu") or {}).get("rx") or {}).get("busy")
    return float(busy) if isinstance(busy, (int, float)) else None


def cell_text(r: dict[str, Any] | None) -> Text:
    """``Gbit/s (busy %)``; a CPU share that was not sampled reads n/a, never 0%."""
    if r is None:
        return Text("-")
    if r["status"] != "ok":
        return Text("n/a" if r["status"] == "unsupported" else "error")
    busy = _busy(r)
    text = Text(f"{r['gbps']:.1f}")
    text.append(f" ({busy:.0f}%)" if busy is not None else " (CPU n/a)")
    if r.get("zcrx_mode") == "copy":
        text.append(" copy")
    if r.get("warning") or r.get("warnings"):
        text.append(" !", style="yellow")
    if (r.get("verify") or {}).get("mismatches"):
        text.append(" MISMATCH", style="red")
    return text


def progress_text(r: dict[str, Any]) -> str:
    """One finished cell in a line of progress; the reasons wait for the notes."""
    if r["status"] != "ok":
        reason = str(r.get("reason") or "")
        return f"{r['status']}" + (f": {reason[:60]}…" if len(reason) > 60 else
                                   f": {reason}" if reason else "")
    busy = _busy(r)
    return (f"{r['gbps']:.1f} Gbit/s, CPU " + (f"{busy:.0f}% busy" if busy is not None
                                                 else "n/a")
            + (" (warning)" if r.get("warning") or r.get("warnings") else ""))


def repeats_text(rows: list[dict[str, Any]]) -> Text:
    """One cell over its repeats: ``cell_text`` of a row holding the medians (Gbit/s, busy %),
    then on a second line the Gbit/s range, and on a third how many repeats did not succeed."""
    ok = [r for r in rows if r["status"] == "ok"]
    if len(rows) == 1 or not ok:
        return cell_text(rows[0])
    med = dict(ok[0], gbps=statistics.median(r["gbps"] for r in ok))
    med["warning"] = next((r.get("warning") for r in ok if r.get("warning")), None)
    med["verify"] = next((r["verify"] for r in ok if (r.get("verify") or {}).get("mismatches")),
                         None)
    busy = [b for r in ok if (b := _busy(r)) is not None]
    med["cpu"] = {"rx": {"busy": statistics.median(busy)}} if busy else None
    text = cell_text(med)
    if len(ok) > 1:
        text.append(f"\n[{min(r['gbps'] for r in ok):.1f}..{max(r['gbps'] for r in ok):.1f}]")
    if len(ok) < len(rows):
        text.append(f"\n{len(rows) - len(ok)}/{len(rows)} failed", style="red")
    return text


def bench_tables(doc: dict[str, Any], *, transposed: bool = False) -> list[Block]:
    """One block per placement: rows MTU and columns engine (as the seed), or ``transposed``."""
    results = doc["results"]
    engines = list(dict.fromkeys(r["engine"] for r in results))
    cells = cell_groups(results)

    def text(mtu: Any, engine: str, placement: str) -> Text:
        key = (mtu, engine, placement)
        return repeats_text(cells[key]) if key in cells else cell_text(None)

    blocks = []
    for placement in dict.fromkeys(r["placement"] for r in results):
        mtus = list(dict.fromkeys(r["mtu"] for r in results if r["placement"] == placement))
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


def bench_legend(doc: dict[str, Any]) -> list[str]:
    """What a cell's numbers mean; the range line only when cells were repeated."""
    lines = ["cell: Gbit/s received (CPU busy %: of the CPU the receiving application ran on, "
             "100 - %idle - %iowait over the cell from /proc/stat; in placement same that CPU "
             "also runs the receive softirq, and in the lab the sender)"]
    if any(len(rows) > 1 for rows in cell_groups(doc["results"]).values()):
        lines.append("repeated cells: medians of the repeats; second line: lowest..highest "
                     "Gbit/s")
    marks = []
    if any(r.get("warning") or r.get("warnings") for r in doc["results"]):
        marks.append("! a warning below")
    if any(r.get("zcrx_mode") == "copy" for r in doc["results"]):
        marks.append("copy: zcrx in copy mode (note below)")
    if marks:
        lines.append("; ".join(marks))
    return lines


def bench_notes(doc: dict[str, Any]) -> list[str]:
    """The run's warnings (busy machine, other labs), why cells did not run (one line per engine
    and reason), cell warnings once per cell, verify failures."""
    notes = [f"warning: {w}" for w in doc.get("warnings") or []]
    if doc.get("complete") is False:
        notes.append(f"incomplete: interrupted after {len(doc['results'])} cells; the "
                     "missing cells were not measured")
    tx_notes: dict[str, None] = {}  # the sender's fallbacks (e.g. no SEND_ZC), once each
    not_run: dict[tuple[str, str, str], list[str]] = {}
    for (mtu, engine, placement), rows in cell_groups(doc["results"]).items():
        where = f"mtu {mtu} {placement}"
        for r in rows:
            if r["status"] != "ok":
                not_run.setdefault((r["status"], engine, r["reason"]), []).append(where)
        ok = [r for r in rows if r["status"] == "ok"]
        notes += cell_warnings(f"{engine} {where}", ok)
        if ok and all(_busy(r) is None for r in ok):
            notes.append(f"CPU n/a: {engine} {where}: the receiving CPU's share was not "
                         "sampled")
        for r in ok:
            if (r.get("tx_stats") or {}).get("note"):
                tx_notes.setdefault(r["tx_stats"]["note"], None)
        for r in rows:
            if (r.get("verify") or {}).get("mismatches"):
                v = r["verify"]
                notes.append(f"verify: {engine} {where}: {v['mismatches']} of "
                             f"{v['checked_bytes']} bytes wrong")
    per_engine: dict[str, int] = {}
    for r in doc["results"]:
        per_engine[r["engine"]] = per_engine.get(r["engine"], 0) + 1
    for (status, engine, reason), cells in not_run.items():
        which = ("all cells" if len(cells) == per_engine[engine] > 1
                 else ", ".join(dict.fromkeys(cells)))  # once per cell, not per repeat
        notes.append(f"{status}: {engine} ({which}): {reason}")
    notes += [f"sender: {n}" for n in tx_notes]
    copied = list(dict.fromkeys(r["engine"] for r in doc["results"]
                                if r.get("zcrx_mode") == "copy"))
    notes += [f"{e} copy: {ZCRX_COPY_NOTE}" for e in copied]
    for r in peer_ratios(doc):
        notes.append(f"mtu {r['mtu']} {r['placement']}: best engine {r['engine']} "
                     f"{r['gbps']:.1f} Gbit/s = {r['ratio']:.2f}x {r['peer']} "
                     f"({r['peer_gbps']:.1f})")
    target = doc["env"].get("target", {})
    if not doc["env"].get("lab"):
        notes.append(target.get("note", "loopback, not a lab"))
    return notes


def print_report(doc: dict[str, Any], console: Console) -> None:
    """The tables (turned when the engines do not fit across), the legend and the notes; text
    from results (reasons, host names) is printed literally."""
    blocks = bench_tables(doc)
    if not all(fits(console, b.table) for b in blocks):
        blocks = bench_tables(doc, transposed=True)
    for b in blocks:
        say(console, b.title, "bold")
        console.print(b.table)
    print_notes(console, [*bench_legend(doc), *bench_notes(doc)])
