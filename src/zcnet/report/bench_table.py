"""The seed's table for ``zcnet bench``: rows MTU, columns engine, one block per placement.

A cell reads ``Gbit/s (receiver CPU busy %)``; a cell that did not run reads ``n/a`` and the
reason goes in a note under the table (and in the JSON).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

PLACEMENT_TITLES = {
    "same": "application on the receive-softirq CPU (same)",
    "split": "application on another CPU than the receive softirq (split)",
}


def cell_text(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if r["status"] != "ok":
        return "n/a" if r["status"] == "unsupported" else "error"
    busy = r.get("cpu", {}).get("rx", {}).get("busy")
    text = f"{r['gbps']:.1f} Gbps"
    if busy is not None:
        text += f" ({busy:.0f}%)"
    if r.get("verify", {}).get("mismatches"):
        text += " [red]MISMATCH[/red]"
    return text


def bench_tables(doc: dict[str, Any]) -> list[Table]:
    results = doc["results"]
    engines = list(dict.fromkeys(r["engine"] for r in results))
    tables = []
    for placement in dict.fromkeys(r["placement"] for r in results):
        rows = [r for r in results if r["placement"] == placement]
        t = Table(title=PLACEMENT_TITLES.get(placement, placement), title_justify="left")
        t.add_column("MTU", justify="right")
        for e in engines:
            t.add_column(e, justify="right")
        for mtu in dict.fromkeys(r["mtu"] for r in rows):
            by_engine = {r["engine"]: r for r in rows if r["mtu"] == mtu}
            t.add_row(str(mtu), *(cell_text(by_engine.get(e)) for e in engines))
        tables.append(t)
    return tables


def bench_notes(doc: dict[str, Any]) -> list[str]:
    notes = []
    for r in doc["results"]:
        where = f"{r['engine']} mtu {r['mtu']} {r['placement']}"
        if r["status"] != "ok":
            notes.append(f"{r['status']}: {where}: {r['reason']}")
        elif r.get("warning"):
            notes.append(f"warning: {where}: {r['warning']}")
        if r.get("verify", {}).get("mismatches"):
            v = r["verify"]
            notes.append(f"verify: {where}: {v['mismatches']} of {v['checked_bytes']} bytes wrong")
    from zcnet.bench.run import peer_ratios

    for r in peer_ratios(doc):
        notes.append(f"mtu {r['mtu']} {r['placement']}: best zcnet engine {r['engine']} "
                     f"{r['gbps']:.1f} Gbps = {r['ratio']:.2f}x {r['peer']} ({r['peer_gbps']:.1f})")
    target = doc["env"].get("target", {})
    if not doc["env"].get("lab"):
        notes.append(target.get("note", "loopback, not a lab"))
    return notes
