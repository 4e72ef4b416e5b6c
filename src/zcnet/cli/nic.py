"""`zcnet nic show|doctor|setup|restore`: the NIC control plane for zero-copy receive."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from zcnet import __version__
from zcnet.bench.meta import collect_env
from zcnet.bench.records import NicFile, to_json
from zcnet.cli._args import Subparsers, ifname, number, span_list, unique
from zcnet.errors import ZcnetError
from zcnet.jsonvalue import JSONObject
from zcnet.netns import netns_path
from zcnet.nic import doctor, info, setup
from zcnet.nic.device import Device
from zcnet.nic.steps import queues_text
from zcnet.rx.zc.area import udmabuf_create

STATUS_STYLE = {doctor.PASS: "green", doctor.FAIL: "red", doctor.UNKNOWN: "yellow"}


def register(sub: Subparsers) -> None:
    parser = sub.add_parser("nic", help="inspect and prepare a NIC for zero-copy receive",
                            description="Header-data split, channels, RSS and flow rules for "
                                        "io_uring zcrx and devmem TCP, with a saved state to "
                                        "restore.")
    actions = parser.add_subparsers(dest="nic_action", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("iface", metavar="IFACE", type=ifname, help="network interface")
        p.add_argument("--netns", metavar="NAME", type=netns_name,
                       help="interface lives in this namespace")

    show = actions.add_parser("show", help="driver, channels, rings/HDS, queues, page pools")
    common(show)
    show.add_argument("--json", action="store_true", help="JSON envelope on stdout")
    show.set_defaults(func=_show)

    doc = actions.add_parser("doctor", help="checklist for zero-copy receive; exit 0 if ready")
    common(doc)
    queues(doc, required=False, help="RX queue to receive on (default: the device's last RX "
                                     "queue)")
    doc.add_argument("--mode", choices=setup.MODES, default="zcrx")
    doc.add_argument("--json", action="store_true", help="JSON envelope on stdout")
    doc.set_defaults(func=_doctor)

    st = actions.add_parser("setup", help="apply the zero-copy configuration, saving the old")
    common(st)
    queues(st, required=True, help="RX queue to steer the port to")
    st.add_argument("--port", type=span_list("port", "port", setup.MAX_PORTS), required=True,
                    metavar="PORT[,PORT|-PORT...]",
                    help="TCP destination ports (9999, 9999,10000 or 9000-9007); with several "
                         "queues and no --rss-context, port i goes to queue i mod N")
    st.add_argument("--mode", choices=setup.MODES, default="zcrx")
    st.add_argument("--rss-context", action="store_true",
                    help="steer the ports to a new RSS context over the queues (flows spread "
                         "by hash) instead of one queue per port")
    st.add_argument("--flow", action="append", choices=sorted(setup.ntuple.FLOW_TYPES),
                    help="flow types to steer (repeatable; default tcp4 and tcp6)")
    st.set_defaults(func=_setup)

    rs = actions.add_parser("restore", help="undo 'zcnet nic setup' from its saved state")
    common(rs)
    rs.set_defaults(func=_restore)


def queues(p: argparse.ArgumentParser, *, required: bool, help: str) -> None:
    """--queue Q, or --queues Q,Q... (several queues); each a tuple: read ``args.queue or
    args.queues``."""
    one = number("queue")

    def one_queue(text: str) -> tuple[int, ...]:
        return (int(one(text)),)

    one_queue.__name__ = "queue"  # argparse's "invalid queue value"
    group = p.add_mutually_exclusive_group(required=required)
    group.add_argument("--queue", type=one_queue, metavar="Q", help=help)
    group.add_argument("--queues", type=span_list("queue", "queue"), metavar="Q[,Q|-Q...]",
                       help="several RX queues (2,3 or 2-5)")


def netns_name(text: str) -> str:
    """An argparse type: a name ``ip netns`` could have made (it may not exist)."""
    try:
        netns_path(text)
    except ZcnetError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
    return text


def _json_out(doc: NicFile) -> None:
    json.dump(to_json(doc), sys.stdout, indent=2)
    sys.stdout.write("\n")


def _nic_file(kind: str, results: list[JSONObject]) -> NicFile:
    return NicFile(version=__version__, argv=sys.argv[1:], kind=kind,
                   env=collect_env(lab=False), results=results)


def _as_json(state: Mapping[str, object]) -> JSONObject:
    """The NIC's state as JSON: what the kernel answered, values JSON lacks (bytes ...) as
    their text."""
    out: JSONObject = json.loads(json.dumps(state, default=str))
    return out


def _kv_table(title: str, rows: Mapping[str, object]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("setting", style="bold")
    table.add_column("value")
    for k, v in rows.items():
        table.add_row(str(k), str(v))
    return table


def _show(args: argparse.Namespace) -> int:
    with Device.open(args.iface, args.netns) as dev:
        state = info.show(dev)
    if args.json:
        _json_out(_nic_file("nic-show", [_as_json(state)]))
        return 0
    console = Console(markup=False)
    drv = state["driver"]
    console.print(Text(str(state["ifname"]), style="bold"),
                  f"ifindex {state['ifindex']}"
                  + (f" netns {state['netns']}" if state["netns"] else "")
                  + (f"  driver {drv.get('driver')} {drv.get('version')} firmware "
                     f"{drv.get('firmware') or '-'} bus {drv.get('bus_info') or '-'}"
                     if "driver" in drv else f"  driver: {drv.get('unsupported')}"))
    for key in ("channels", "rings"):
        console.print(_kv_table(key, state[key]))
    feats = dict(state["features"])
    feats.pop("active", None)
    console.print(_kv_table("offloads", feats))
    for key in ("private_flags", "rss", "ntuple_rules"):
        value = state[key]
        if isinstance(value, dict) and "indir" in value:
            value = dict(value, indir=" ".join(map(str, value["indir"])) or "-")
        console.print(_kv_table(key.replace("_", " "), value if isinstance(value, dict)
                                else {"count": value}))
    queues = state["queues"]
    if isinstance(queues, list):
        table = Table(title="queues", title_justify="left")
        for col in ("queue", "napi", "page pools", "irq", "irq cpus", "napi thread cpu",
                    "providers"):
            table.add_column(col)
        for q in queues:
            table.add_row(f"{q['type']} {q['id']}", str(q.get("napi") or "-"),
                          " ".join(map(str, q.get("page_pools", []))) or "-",
                          str(q.get("irq") or "-"), q.get("effective") or q.get("affinity")
                          or "-", _thread_cpu(q),
                          ", ".join(q["providers"]) or "-")
        console.print(table)
    else:
        console.print(_kv_table("queues", queues))
    pools = state["page_pools"]
    stats = state["page_pool_stats"]
    if isinstance(pools, list):
        console.print(f"page pools: {len(pools)}"
                      + "".join(f"\n  id {p.get('id')} napi {p.get('napi-id', '-')} inflight "
                                f"{p.get('inflight', '-')}"
                                + (" io-uring" if "io-uring" in p else "")
                                + (f" dmabuf {p['dmabuf']}" if "dmabuf" in p else "")
                                for p in pools))
    if isinstance(stats, dict):
        console.print(stats.get("unsupported"))
    else:
        for s in stats:
            console.print(f"  pool {s.get('info', {}).get('id')}: "
                          + " ".join(f"{k}={v}" for k, v in s.items() if k != "info"))
    return 0


def _thread_cpu(q: Mapping[str, object]) -> str:
    """"-" without a NAPI thread; n/a when it has one whose CPU could not be read."""
    if "napi_thread" not in q:
        return "-"
    return "n/a" if q.get("napi_thread_cpu") is None else str(q["napi_thread_cpu"])


def _doctor(args: argparse.Namespace) -> int:
    with Device.open(args.iface, args.netns) as dev:
        qs = doctor.pick_queues(dev, args.queue or args.queues)
        checks = doctor.run(dev, qs, args.mode, dmabuf=udmabuf_create)
    ok = doctor.all_pass(checks)
    if args.json:
        doc = _nic_file("nic-doctor", [_as_json(c.as_dict()) for c in checks])
        doc.ready, doc.queue, doc.queues, doc.mode = ok, qs[0], list(qs), args.mode
        _json_out(doc)
        return 0 if ok else 1
    # Three columns, the fix under its detail: four narrow ones wrapped every cell at 80.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check")
    table.add_column("detail, and the fix")
    for c in checks:
        detail = Text(c.detail)
        if c.fix:
            detail.append(f"\nfix: {c.fix}", style="dim")
        table.add_row(Text(c.status, style=STATUS_STYLE[c.status]), c.name, detail)
    console = Console(markup=False)
    console.print(Text(f"{args.iface}: ready for {args.mode} on {queues_text(qs)}?",
                       style="bold"))
    console.print(table)
    if ok:
        console.print(Text("ready", style="green"))
    else:
        console.print(Text("not ready", style="red"),
                      f": {sum(c.status != doctor.PASS for c in checks)} of {len(checks)} "
                      "checks did not pass", sep="")
    return 0 if ok else 1


def _setup(args: argparse.Namespace) -> int:
    cfg = setup.NicConfig(args.iface, args.queue or args.queues, args.port, args.mode,
                          args.rss_context, args.netns,
                          tuple(unique(args.flow)) if args.flow else ("tcp4", "tcp6"))
    steps = setup.apply(cfg)
    console = Console(markup=False)
    for s in steps:
        console.print(f"done: {s.title}")
    console.print(f"state saved in {setup.state_path(cfg.ifname, cfg.netns)}; undo with "
                  f"'zcnet nic restore {cfg.ifname}"
                  + (f" --netns {cfg.netns}'" if cfg.netns else "'"))
    return 0


def _restore(args: argparse.Namespace) -> int:
    undone = setup.restore(args.iface, args.netns)
    console = Console(markup=False)
    for title in undone:
        console.print(f"undone: {title}")
    console.print(f"{args.iface} restored")
    return 0
