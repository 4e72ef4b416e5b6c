"""`zcnet txbench`: UDP single-stream packet rate, one packet per call vs batched sends."""

from __future__ import annotations

import argparse
import sys

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zcnet.bench.meta import Interrupted, write_json
from zcnet.bench.records import MeanSd, ModeSummary, ResultFile
from zcnet.bench.txbench import ALL_MODES, BASELINE, NOT_MEASURED, parse_dst, run_txbench
from zcnet.cli._args import Subparsers, check_output_file, choice_list, number, number_list
from zcnet.report.export import print_notes
from zcnet.tx.hwcount import NO_COUNTERS


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "txbench", help="UDP packet rate: one send per packet vs batched sends",
        description="A pktgen-like UDP single stream from one lab namespace into a sink in the "
                    "other (or to --dst). Modes: single (send per packet), mmsg (sendmmsg per "
                    "burst), uring (a burst of SEND SQEs, one io_uring_enter), gso (UDP_SEGMENT, "
                    "one send per burst; bursts GSO cannot carry go by mmsg and are counted). "
                    "Not devmem: devmem TX is TCP-only in the kernel (zcnet bench --tx devmem).")
    # Paths txbench cannot measure parse, so run_txbench says why they are refused.
    p.add_argument("--mode", type=choice_list("mode", (*ALL_MODES, *NOT_MEASURED)),
                   default=list(ALL_MODES),
                   help=f"comma-separated modes (default {','.join(ALL_MODES)})")
    p.add_argument("--size", type=number("payload"), default=64, help="UDP payload bytes (64)")
    p.add_argument("--sizes", type=number_list("payload", "size", unique=False), default=None,
                   help="mixed payload sizes, repeated across each burst (e.g. 64,64,128)")
    p.add_argument("--burst", type=number("burst"), default=32, help="packets per burst (32)")
    p.add_argument("--duration", "-t", type=number("duration"), default=1.0,
                   help="seconds per mode and repeat (1)")
    p.add_argument("--packets", type=number("packets"), default=None,
                   help="send exactly this many packets per repeat instead of --duration")
    p.add_argument("--repeat", type=number("repeat"), default=5, help="repeats per mode (5)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--dst", metavar="ADDR:PORT", default=None,
                       help="send to this address instead of a lab sink (no received counts)")
    where.add_argument("--loopback", action="store_true",
                       help="sink on loopback in this namespace instead of a lab (no root needed)")
    p.add_argument("--mtu", type=number("mtu"), default=1500, help="lab veth MTU (1500)")
    p.add_argument("--ipv6", action="store_true", help="use the lab's IPv6 addresses")
    p.add_argument("--json", metavar="PATH", help="write results in the zcnet JSON envelope")
    p.set_defaults(func=_run, without_lab="--loopback")


LEGEND = ("Mpps, ns/pkt: mean±stdev over the repeats; ns/pkt: the sending thread's CPU time per "
          "packet; drops: sent - sink received; bad: damaged payloads; fallbk: packets GSO "
          "could not carry (sent by sendmmsg); retry: sends retried after EAGAIN/ENOBUFS")


def _show(doc: ResultFile, console: Console) -> None:
    console.print(render(doc))
    print_notes(console, [LEGEND])
    for line in seed_lines(doc):
        console.print(Text(line))
    if doc.complete is False:
        console.print(Text("incomplete: interrupted; rows measured before Ctrl-C only",
                           style="yellow"))


def _run(args: argparse.Namespace) -> int:
    check_output_file(args.json, "--json")
    if args.dst is not None:
        parse_dst(args.dst)  # a bad address fails before anything is set up
    console = Console(markup=False)
    try:
        with console.status("txbench: sending…"):
            doc = run_txbench(modes=args.mode, size=args.size, sizes=args.sizes,
                              burst=args.burst, duration=args.duration, packets=args.packets,
                              repeat=args.repeat, dst=args.dst, lab=not args.loopback,
                              mtu=args.mtu, ipv6=args.ipv6)
    except Interrupted as stop:
        _save_and_show(args.json, stop.doc, console)
        kept = len(stop.doc.results)
        where = f" in {args.json}" if args.json else " (pass --json to keep them)"
        print(f"zcnet: interrupted: {kept} measured rows kept{where}", file=sys.stderr)
        return 130
    _save_and_show(args.json, doc, console)
    if args.json:
        console.print(Text(f"wrote {args.json}"))
    return 0


def _save_and_show(path: str | None, doc: ResultFile, console: Console) -> None:
    """The file first; if it cannot be written, the table is still shown before the error."""
    try:
        if path:
            write_json(path, doc)
    finally:
        _show(doc, console)


def _pm(stat: MeanSd | None, digits: int) -> str:
    if stat is None or stat.mean is None or stat.stdev is None:
        return "-"
    return f"{stat.mean:.{digits}f}±{stat.stdev:.{digits}f}"


def mode_summaries(doc: ResultFile) -> dict[str, ModeSummary]:
    """A txbench document's summary: one entry per send mode."""
    return doc.summary if isinstance(doc.summary, dict) else {}


def render(doc: ResultFile) -> Table:
    summary = mode_summaries(doc)
    first = doc.results[0] if doc.results else None
    hw = doc.env.hw_counters == "yes"
    repeats = len(doc.results) // max(len(summary), 1)
    title = (f"txbench: UDP payload {first.payload} B, burst {first.burst}, "
             f"{repeats} repeats" if first else "txbench: nothing measured")
    table = Table(title=Text(title), title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, show_edge=False)
    columns = ["mode", "Mpps", f"vs {BASELINE}", "ns/pkt"]
    if hw:
        columns += ["instr/pkt", "cycles/pkt"]
    columns += ["drops", "bad", "fallbk", "retry"]
    for column in columns:
        table.add_column(column, justify="left" if column == "mode" else "right", no_wrap=True)
    for mode, s in summary.items():
        if s.status != "ok":
            table.add_row(mode, Text(f"{s.status}: {s.reason or ''}", style="yellow"),
                          *[""] * (len(columns) - 2))
            continue
        ratio = f"{s.vs_single:.2f}x" if s.vs_single else "-"
        cells = [mode, _pm(s.mpps, 3), ratio, _pm(s.ns_per_pkt, 0)]
        if hw:
            cells += [_pm(s.instructions_per_pkt, 0), _pm(s.cycles_per_pkt, 0)]
        if s.received is not None:
            got = str(s.drops)
            damaged = str((s.bad_payload or 0) + (s.wrong_size or 0))
        else:
            got, damaged = "n/a", "n/a"
        cells += [got, damaged, str(s.fallback_packets or 0), str(s.retries or 0)]
        table.add_row(*cells)
    return table


def seed_lines(doc: ResultFile) -> list[str]:
    """The seed's summary: baseline -> best batched mode, with ±."""
    summary = mode_summaries(doc)
    base = summary.get(BASELINE)
    batched = [(m, s) for m, s in summary.items() if m != BASELINE and s.status == "ok"]
    if not base or base.status != "ok" or not batched:
        return []
    mode, best = max(batched, key=lambda ms: (ms[1].mpps.mean if ms[1].mpps else None) or 0.0)

    def arrow(metric: str, unit: str, digits: int) -> str:
        a, b = base.metric(metric), best.metric(metric)
        if a is None or b is None or a.mean is None or b.mean is None \
                or a.stdev is None or b.stdev is None:
            return NO_COUNTERS
        return (f"{a.mean:.{digits}f}{unit} (±{a.stdev:.{digits}f}) -> "
                f"{b.mean:.{digits}f}{unit} (±{b.stdev:.{digits}f})")

    ratio = f" ({best.vs_single:.2f}x)" if best.vs_single else ""
    lines = [f"{BASELINE} -> {mode}{ratio}:",
             f"  Packet rate: {arrow('mpps', ' Mpps', 3)}",
             f"  CPU per packet: {arrow('ns_per_pkt', ' ns', 0)}",
             f"  Instructions per packet: {arrow('instructions_per_pkt', '', 0)}",
             f"  Cycles per packet: {arrow('cycles_per_pkt', '', 0)}"]
    notes = sorted({n for s in summary.values() for n in s.notes or []})
    lines += [f"note: {n}" for n in notes]
    return lines
