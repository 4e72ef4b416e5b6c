"""`zcnet lab up|down|status`: the namespace lab by hand."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from zcnet.cli._args import Subparsers, number, unique
from zcnet.lab import Lab
from zcnet.lab.netdevsim import DEFAULT_QUEUES
from zcnet.lab.sweep import LabInfo, lab_status, sweep_stale, take_down
from zcnet.lab.topology import DEVICES, MTU_MAX, MTU_MIN


def register(sub: Subparsers) -> None:
    parser = sub.add_parser("lab", help="create, list and remove namespace labs",
                            description="Two network namespaces joined by a veth pair, "
                                        "for running benchmarks on one machine.")
    actions = parser.add_subparsers(dest="lab_action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="create a lab that stays until `zcnet lab down NAME`")
    up.add_argument("--mtu", type=number("mtu"), default=1500,
                    help=f"veth MTU, {MTU_MIN}..{MTU_MAX}")
    up.add_argument("--no-ipv6", action="store_true", help="IPv4 addresses only")
    up.add_argument("--device", choices=DEVICES, default="veth",
                    help="join the namespaces with a veth pair (default) or two linked "
                         "netdevsim ports (needs netdevsim: `zcnet vm run --kernel nsim`)")
    up.add_argument("--queues", type=int, default=DEFAULT_QUEUES,
                    help=f"netdevsim queues per port (default {DEFAULT_QUEUES})")
    up.add_argument("--json", action="store_true", help="print the lab as JSON")
    up.set_defaults(func=_up)

    down = actions.add_parser("down", help="remove lab NAME; without NAME, labs whose owner died")
    down.add_argument("names", nargs="*", metavar="NAME", help="lab (or namespace) name")
    down.add_argument("--force", action="store_true",
                      help="also remove a lab whose owning process still runs")
    down.set_defaults(func=_down)

    status = actions.add_parser("status", help="list zcnet labs on this machine")
    status.set_defaults(func=_status)


def _up(args: argparse.Namespace) -> int:
    lab = Lab(mtu=args.mtu, ipv6=not args.no_ipv6, persistent=True, device=args.device,
              queues=args.queues).up()
    if args.json:
        print(json.dumps(lab_json(lab), indent=1))
        return 0
    table = Table(title=f"lab {lab.name} (MTU {lab.mtu})")
    for column in ("namespace", "interface", "IPv4", "IPv6"):
        table.add_column(column)
    for ns, ifname, addr, addr6 in ((lab.ns_a, lab.if_a, lab.addr_a, lab.addr6_a),
                                    (lab.ns_b, lab.if_b, lab.addr_b, lab.addr6_b)):
        table.add_row(ns, ifname, f"{addr}/{lab.prefixlen}",
                      f"{addr6}/{lab.prefixlen6}" if addr6 else "-")
    console = Console(markup=False)
    console.print(table)
    console.print(f"run inside: ip netns exec {lab.ns_a} CMD    remove: zcnet lab down {lab.name}")
    return 0


def lab_json(lab: Lab) -> dict[str, object]:
    sides = [{"namespace": ns, "interface": ifname, "ipv4": f"{addr}/{lab.prefixlen}",
              "ipv6": f"{addr6}/{lab.prefixlen6}" if addr6 else None}
             for ns, ifname, addr, addr6 in ((lab.ns_a, lab.if_a, lab.addr_a, lab.addr6_a),
                                             (lab.ns_b, lab.if_b, lab.addr_b, lab.addr6_b))]
    return {"name": lab.name, "device": lab.device, "mtu": lab.mtu,
            "queues": lab.queues if lab.device == "netdevsim" else None,
            "namespaces": [lab.ns_a, lab.ns_b], "sides": sides,
            "remove": f"zcnet lab down {lab.name}"}


def _down(args: argparse.Namespace) -> int:
    console = Console(markup=False)
    if not args.names:
        swept = sweep_stale()
        console.print(f"removed stale labs: {' '.join(swept)}" if swept else "no stale labs")
        return 0
    for name in unique(args.names):
        console.print(f"removed lab {take_down(name, force=args.force).name}")
    return 0


def _owner(info: LabInfo) -> str:
    if info.owner is None:
        return "persistent"
    return f"{info.owner} ({'running' if info.alive else 'gone: stale'})"


def _rows(info: LabInfo) -> list[tuple[str, ...]]:
    """One row per veth end; the lab's own columns only on its first row."""
    head = (info.name, _owner(info), str(info.mtu) if info.mtu is not None else "-")
    if not info.links:
        return [(*head, " ".join(info.namespaces), info.problem or "-", "-")]
    blank = ("",) * len(head)
    return [(*(head if i == 0 else blank), ln.ns, f"{ln.ifname} {ln.state}",
             " ".join(ln.addrs) or "-") for i, ln in enumerate(info.links)]


def _status(args: argparse.Namespace) -> int:
    labs = lab_status()
    console = Console(markup=False)
    if not labs:
        console.print("no zcnet labs")
        return 0
    table = Table(title="zcnet labs")
    for column in ("lab", "owner", "MTU", "namespace", "interface", "addresses"):
        table.add_column(column)
    for info in labs:
        for row in _rows(info):
            table.add_row(*row)
    console.print(table)
    return 0
