"""The seed's table for ``zcnet bench``: rows MTU, columns engine, one block per placement.

A cell reads ``Gbit/s (receiver CPU busy %)``; a cell that did not run reads ``n/a`` and the
reason goes in a note under the table (and in the JSON); `` !`` marks a cell with a warning.
A zcrx cell where the kernel copied into the area (copy mode, no NIC queue) reads ``copy``
after its numbers, with a note. A cell run several times (``--repeat``) reads the medians of its
repeats and their Gbit/s range, ``[min..max]``, and says how many failed, if any.
"""

from __future__ import annotations

import statistics
from typing import Any

from rich.table import Table
from rich.text import Text

from zcnet.bench.matrix import cell_groups, peer_ratios

ZCRX_COPY_NOTE = ("zcrx copy mode: no NIC queue here, so the kernel copied every byte into the "
                  "zcrx area; the zcrx protocol ran for real (RECV_ZC, area offsets, refill ring),"
                  " zero copy did not")

PLACEMENT_TITLES = {
    "same": "application on the receive-softirq CPU (same)",
    "split": "application on another CPU than the receive softirq (split)",
}


def cell_text(r: dict[str, Any] | None) -> Text:
    """``Gbit/s (busy %)``; a CPU share that was not sampled is left out, never shown as 0%."""
    if r is None:
        return Text("-")
    if r["status"] != "ok":
        return Text("n/a" if r["status"] == "unsupported" else "error")
    busy = ((r.get("cpu") or {}).get("rx") or {}).get("busy")
    text = Text(f"{r['gbps']:.1f} Gbps")
    text.append(f" ({busy:.0f}%)" if busy is not None else " (CPU n/a)")
    if r.get("zcrx_mode") == "copy":
        text.append(" copy")
    if r.get("warning"):
        text.append(" !", style="yellow")
    if (r.get("verify") or {}).get("mismatches"):
        text.append(" MISMATCH", style="red")
    return text


def repeats_text(rows: list[dict[str, Any]]) -> Text:
    """One cell over its repeats: ``cell_text`` of a row holding the medians (Gbit/s, busy %),
    then the Gbit/s range and how many repeats did not succeed."""
    ok = [r for r in rows if r["status"] == "ok"]
    if len(rows) == 1 or not ok:
        return cell_text(rows[0])
    med = dict(ok[0], gbps=statistics.median(r["gbps"] for r in ok))
    med["warning"] = next((r["warning"] for r in ok if r.get("warning")), None)
    busy = [b for r in ok if (b := ((r.get("cpu") or {}).get("rx") or {}).get("busy"))
            is not None]
    med["cpu"] = {"rx": {"busy": statistics.median(busy)}} if busy else None
    text = cell_text(med)
    if len(ok) > 1:
        text.append(f" [{min(r['gbps'] for r in ok):.1f}..{max(r['gbps'] for r in ok):.1f}]")
    if len(ok) < len(rows):
        text.append(f" {len(rows) - len(ok)}/{len(rows)} failed", style="red")
    return text


def bench_tables(doc: dict[str, Any]) -> list[Table]:
    results = doc["results"]
    engines = list(dict.fromkeys(r["engine"] for r in results))
    tables = []
    for placement in dict.fromkeys(r["placement"] for r in results):
        rows = [r for r in results if r["placement"] == placement]
        t = Table(title=Text(PLACEMENT_TITLES.get(placement, str(placement))),
                  title_justify="left")
        t.add_column("MTU", justify="right")
        for e in engines:
            t.add_column(Text(str(e)), justify="right")
        cells = cell_groups(rows)
        for mtu in dict.fromkeys(r["mtu"] for r in rows):
            t.add_row(str(mtu), *(repeats_text(cells[mtu, e, placement])
                                  if (mtu, e, placement) in cells else cell_text(None)
                                  for e in engines))
        tables.append(t)
    return tables


def bench_notes(doc: dict[str, Any]) -> list[str]:
    """Why cells did not run (one line per engine and reason), warnings, verify failures."""
    notes = []
    if doc.get("complete") is False:
        notes.append(f"incomplete: interrupted after {len(doc['results'])} cells; the "
                     "missing cells were not measured")
    tx_notes: dict[str, None] = {}  # the sender's fallbacks (e.g. no SEND_ZC), once each
    not_run: dict[tuple[str, str, str], list[str]] = {}
    for r in doc["results"]:
        where = f"mtu {r['mtu']} {r['placement']}"
        if r["status"] != "ok":
            not_run.setdefault((r["status"], r["engine"], r["reason"]), []).append(where)
        elif r.get("warning"):
            notes.append(f"warning: {r['engine']} {where}: {r['warning']}")
        if r["status"] == "ok" and ((r.get("cpu") or {}).get("rx") or {}).get("busy") is None:
            notes.append(f"CPU n/a: {r['engine']} {where}: the receiving CPU's share was not "
                         "sampled")
        if (r.get("tx_stats") or {}).get("note"):
            tx_notes.setdefault(r["tx_stats"]["note"], None)
        if r.get("verify", {}).get("mismatches"):
            v = r["verify"]
            notes.append(f"verify: {r['engine']} {where}: {v['mismatches']} of "
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
        notes.append(f"mtu {r['mtu']} {r['placement']}: best zcnet engine {r['engine']} "
                     f"{r['gbps']:.1f} Gbps = {r['ratio']:.2f}x {r['peer']} ({r['peer_gbps']:.1f})")
    target = doc["env"].get("target", {})
    if not doc["env"].get("lab"):
        notes.append(target.get("note", "loopback, not a lab"))
    return notes
