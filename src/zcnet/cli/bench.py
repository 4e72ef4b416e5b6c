"""``zcnet bench``: single-flow TCP receive throughput, engine x MTU x placement."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.text import Text

from zcnet.bench.matrix import DEFAULT_ENGINES, PLACEMENTS, BenchOptions, verify_failed
from zcnet.bench.meta import Interrupted
from zcnet.bench.peers import PEERS
from zcnet.bench.proto import OptionValue
from zcnet.bench.records import ResultFile, ResultRow
from zcnet.cli._args import (
    Subparsers,
    check_ifname,
    check_output_file,
    choice_list,
    number,
    number_list,
)
from zcnet.cli._progress import CellProgress
from zcnet.errors import UsageError, ZcnetError
from zcnet.netns import can_create_netns
from zcnet.report import plots
from zcnet.report.bench_table import print_report, progress_text
from zcnet.report.export import make_console, say
from zcnet.rx.engine import CONSUMERS
from zcnet.rx.registry import engine_names
from zcnet.tx.senders import KINDS


def register(sub: Subparsers) -> None:
    p = sub.add_parser("bench", help="single-flow TCP receive benchmark (epoll vs io_uring ...)",
                       description=__doc__)
    p.add_argument("--mtu", type=number_list("mtu", "MTU"), default=None,
                   help="comma-separated MTUs (default 1500,4096,9000 in the lab; lo's MTU "
                        "on loopback)")
    p.add_argument("--engine", type=choice_list("engine", engine_names), default=DEFAULT_ENGINES,
                   help=f"comma-separated engines from {','.join(engine_names())} "
                        f"(default {','.join(DEFAULT_ENGINES)})")
    p.add_argument("--placement", type=choice_list("placement", PLACEMENTS), default=PLACEMENTS,
                   help="same (app on the softirq CPU), split (another CPU); default both")
    p.add_argument("--duration", type=number("duration"), default=2.0,
                   help="seconds per cell (default 2)")
    p.add_argument("--repeat", type=number("repeat"), default=1, metavar="N",
                   help="run every cell N times, interleaved (each repeat runs every cell "
                        "once); the table shows medians and ranges, the JSON every run and a "
                        "summary; `zcnet compare` needs 2 or more for a verdict (default 1)")
    p.add_argument("--verify", action="store_true",
                   help="check every received byte against the sender's pattern")
    p.add_argument("--tx", default="copy", choices=tuple(KINDS), metavar="PATH",
                   help="sender's send path: copy, msgzc (MSG_ZEROCOPY), sendzc (io_uring SEND_ZC "
                        "from a fixed buffer), sendzc-plain, devmem (from a udmabuf bound to the "
                        "sending device: needs netmem TX, e.g. --lab-device netdevsim in the "
                        "nsim VM) (default copy)")
    p.add_argument("--consumer", choices=CONSUMERS, default="same",
                   help="zero-copy engines: release chunks in the ring's thread (same) or hand "
                        "them to a consumer thread (thread), the zcrx-refs experiment")
    p.add_argument("--ifname", help="zcrx/devmem: NIC whose queue the flow is steered to")
    p.add_argument("--queue", type=number("queue"), help="zcrx/devmem: the queue id on --ifname "
                   "(or on the lab's receiving port with --lab-device netdevsim)")
    p.add_argument("--lab-device", choices=("veth", "netdevsim"), default="veth",
                   help="the lab's link; netdevsim needs zcnet's test kernel "
                        "(`zcnet vm run --kernel nsim -- zcnet bench ...`)")
    p.add_argument("--no-rx-steer", dest="rx_steer", action="store_false",
                   help="leave the veth lab's receive where veth puts it (the sending CPU, "
                        "so one flow is received on two CPUs and reordered) instead of "
                        "steering it to the sender's CPU")
    p.add_argument("--peers", type=choice_list("peer", tuple(PEERS)), default=(),
                   help="also run these C tools in the same lab and placement: iperf3,sockperf")
    p.add_argument("--json", metavar="FILE", help="write results (JSON envelope) to FILE, and "
                   "PNG plots beside it (FILE's name with -throughput-vs-mtu.png and "
                   "-cpu-breakdown.png)")
    p.add_argument("--no-plots", dest="plots", action="store_false",
                   help="write no plots beside --json")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--no-lab", dest="lab", action="store_false", default=None,
                       help="run on loopback instead of a namespace lab")
    where.add_argument("--lab", dest="lab", action="store_true", help="require the lab (root)")
    p.set_defaults(func=main, without_lab="--no-lab")


def _engine_opts(args: argparse.Namespace) -> dict[str, OptionValue]:
    lab_queue = args.lab_device == "netdevsim" and args.ifname is None
    if (args.ifname is None) != (args.queue is None) and not lab_queue:
        raise UsageError("--ifname and --queue go together", "give both, e.g. --ifname eth2 "
                         "--queue 2 (see `zcnet nic doctor IFACE`)")
    opts: dict[str, OptionValue] = {"consumer": args.consumer}
    if args.ifname is not None:
        opts.update(ifname=args.ifname, queue=args.queue)
    elif args.queue is not None:
        opts.update(queue=args.queue)
    return opts


def _plots(doc: ResultFile, json_path: str, console: Console) -> None:
    """The PNG plots beside the JSON; a missing matplotlib is a note, the results stand."""
    try:
        paths = plots.plot_beside(doc, json_path)
    except ZcnetError as exc:
        say(console, f"plots not written: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""),
            "yellow")
        return
    if paths:
        say(console, "plots: " + ", ".join(map(str, paths)), "dim")


def _report(doc: ResultFile, args: argparse.Namespace, out: Console) -> None:
    print_report(doc, out)
    if args.json and args.plots:
        _plots(doc, args.json, out)


def main(args: argparse.Namespace) -> int:
    # Imported here, not at the top: every `zcnet` command loads this module to build its
    # parser, and only `zcnet bench` needs the runner (servers, labs, clients).
    from zcnet.bench.run import run_bench

    check_output_file(args.json, "--json")
    check_ifname(args.ifname)
    opts = BenchOptions(mtus=args.mtu, engines=args.engine, placements=args.placement,
                        duration=args.duration, verify=args.verify, lab=args.lab,
                        json_path=args.json, peers=args.peers,
                        tx=args.tx, engine_opts=_engine_opts(args),
                        lab_device=args.lab_device, repeat=args.repeat,
                        rx_steer=args.rx_steer).resolved()
    opts.validate()
    if opts.peers and not opts.lab:
        raise UsageError("--peers run inside the lab, and this run is on loopback",
                         "leave out --no-lab" if can_create_netns() else "run as root for the lab")
    console = Console(stderr=True, markup=False)
    if args.lab is None and not can_create_netns():
        console.print(Text("zcnet: no CAP_NET_ADMIN/CAP_SYS_ADMIN (not root): running on "
                           "127.0.0.1 (loopback) instead of a lab of network namespaces; MTU "
                           "is lo's"))
    total = len(opts.cells()) * opts.repeat
    out = make_console()
    with CellProgress(console, total, "bench") as progress:
        def on_start(mtu: int, engine: str, placement: str) -> None:
            progress.start(f"{engine} mtu {mtu} {placement}")

        def on_cell(r: ResultRow) -> None:
            progress.done(f"{r.engine} mtu {r.mtu} {r.placement}", progress_text(r))

        try:
            doc = run_bench(opts, on_cell, on_start)
        except Interrupted as stop:
            progress.stop()
            _report(stop.doc, args, out)
            kept = len(stop.doc.results)
            where = f" in {args.json}" if args.json else " (pass --json to keep them)"
            print(f"zcnet: interrupted: {kept} of {total} cells measured{where}",
                  file=sys.stderr)
            return 130
    _report(doc, args, out)
    if args.json:
        say(out, f"results written to {args.json}", "dim")
    if opts.verify and verify_failed(doc.results):
        print("zcnet: error: received data did not match what was sent", file=sys.stderr)
        return 1
    return 0
