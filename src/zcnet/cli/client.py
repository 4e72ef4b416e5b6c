"""``zcnet client``: drive flows between two zcnet servers (kperf-style) and report them."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import re
import sys

from zcnet import quantities
from zcnet.bench import client
from zcnet.bench.authtoken import read_token
from zcnet.bench.client import ClientOptions, ClientResult
from zcnet.bench.meta import collect_env, envelope, write_json
from zcnet.bench.proto import OptionValue
from zcnet.bench.records import Env, Latency, ResultRow, to_json
from zcnet.bench.remote import RemoteServer
from zcnet.cli._args import Subparsers, check_output_file, number
from zcnet.errors import UsageError
from zcnet.jsonvalue import JSONObject, JSONValue
from zcnet.report.export import make_console, print_tables, write_text
from zcnet.report.tables import Table, fmt_share, mpstat_columns, mpstat_legend
from zcnet.rx.registry import engine_names

_SIZE = re.compile(r"(\d+)([kKmMgG]?)(i?[bB])?\Z")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def size(text: str) -> int:
    """``4096``, ``64K``, ``1M``, ``1MiB`` -> bytes (binary units)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4096, 64K, 1M)")
    value = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if (why := quantities.problem("buffer", value)) is not None:
        raise argparse.ArgumentTypeError(f"{text}: {why}")
    return value


def register(sub: Subparsers) -> None:
    p = sub.add_parser("client", help="run flows between two zcnet servers (kperf-style)",
                       description="Open flows from the --src server to the --dst server, place "
                       "them by RX CPU, run them, and report throughput or latency, per-CPU "
                       "shares and TCP_INFO deltas. The client carries no traffic itself.")
    p.add_argument("--src", default=None, metavar="HOST[:PORT]",
                   help="server that sends (default 127.0.0.1, or the --ssh host)")
    p.add_argument("--dst", default=None, metavar="HOST[:PORT]",
                   help="server that receives (default: as --src)")
    p.add_argument("--data-host", metavar="ADDR",
                   help="address the flows connect to on dst (default: dst's control host)")
    p.add_argument("--data-port", type=number("port"), metavar="PORT",
                   help="receive flow N on PORT+N on dst (the ports `zcnet nic setup --port "
                        "PORT-...` steers to the zero-copy queues); default: any free port")
    p.add_argument("--rx-engine", default="epoll",
                   help=f"receive engine on dst: {', '.join(engine_names())} (default epoll)")
    p.add_argument("--rx-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="rx engine option, repeatable (e.g. ifname=eth1, queue=3 for zcrx)")
    p.add_argument("--tx", default="copy",
                   help="send path on src: copy, msgzc, sendzc, sendzc-plain, devmem (needs a "
                        "device with netmem TX on src) (default copy)")
    p.add_argument("--verify", action="store_true",
                   help="stream: check every received byte against the sent pattern")
    p.add_argument("-n", "--flows", type=number("flows"), default=1)
    p.add_argument("-t", "--duration", type=number("duration"), default=5.0, metavar="S")
    p.add_argument("--read-size", type=size, default=1 << 20, metavar="BYTES")
    p.add_argument("--write-size", type=size, default=1 << 20, metavar="BYTES")
    p.add_argument("--rr", action="store_true", help="request/response instead of stream")
    p.add_argument("--req-size", type=size, metavar="BYTES", help="request size (implies --rr)")
    p.add_argument("--resp-size", type=size, metavar="BYTES",
                   help="response size (implies --rr)")
    p.add_argument("--cpu-min", type=number("cpu"), help="reconnect until the RX CPU is >= this")
    p.add_argument("--cpu-max", type=number("cpu"), help="reconnect until the RX CPU is <= this")
    p.add_argument("--pin-off", type=number("cpu"), metavar="K",
                   help="pin each application end to its RX CPU + K")
    p.add_argument("--rx-app-cpu", type=number("cpu"), metavar="CPU",
                   help="pin the receiving applications here (overrides --pin-off)")
    p.add_argument("--tx-app-cpu", type=number("cpu"), metavar="CPU",
                   help="pin the sending applications here (overrides --pin-off)")
    p.add_argument("--max-attempts", type=number("attempts"), default=64,
                   help="connections tried per flow")
    p.add_argument("--token-file", metavar="FILE", help="shared secret of the servers")
    p.add_argument("--ssh", action="append", default=[], metavar="HOST",
                   help="start a server on HOST over ssh for this run (repeatable)")
    p.add_argument("--ssh-cmd", default="ssh", help="ssh program (default ssh)")
    p.add_argument("--ssh-port", type=number("port"), default=18323,
                   help="port of ssh-started servers")
    p.add_argument("--ssh-python", default="python3", help="python on the remote host")
    p.add_argument("--ssh-listen", default="0.0.0.0", metavar="ADDR",
                   help="address ssh-started servers listen on (default all)")
    p.add_argument("--json", metavar="PATH", help="write results (envelope kind 'client')")
    p.add_argument("--csv", metavar="PATH", help="write one row per flow")
    p.set_defaults(func=run)


def engine_opts(pairs: list[str]) -> dict[str, OptionValue]:
    out: dict[str, OptionValue] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--rx-opt {pair!r}", "use KEY=VALUE, e.g. --rx-opt queue=3")
        low = value.lower()
        out[key] = (int(value) if re.fullmatch(r"-?\d+", value)
                    else low == "true" if low in ("true", "false") else value)
    return out


def options(args: argparse.Namespace) -> ClientOptions:
    rr = args.rr or args.req_size is not None or args.resp_size is not None
    src = args.src or (f"{args.ssh[0]}:{args.ssh_port}" if args.ssh else "127.0.0.1")
    return ClientOptions(
        src=src, dst=args.dst or src, data_host=args.data_host, data_port=args.data_port,
        mode="rr" if rr else "stream", flows=args.flows, duration=args.duration,
        rx_engine=args.rx_engine, engine_opts=engine_opts(args.rx_opt), tx=args.tx,
        verify=args.verify,
        read_size=args.read_size,
        write_size=args.write_size, req_size=args.req_size or 1, resp_size=args.resp_size or 1,
        cpu_min=args.cpu_min, cpu_max=args.cpu_max, pin_off=args.pin_off,
        rx_app_cpu=args.rx_app_cpu, tx_app_cpu=args.tx_app_cpu,
        max_attempts=args.max_attempts,
        token=read_token(args.token_file) if args.token_file else None)


def run(args: argparse.Namespace) -> int:
    if args.ssh and not 1 <= args.ssh_port <= 65535:
        raise UsageError(f"--ssh-port {args.ssh_port} out of range",
                         "give the port (1..65535) the remote server should listen on")
    opts = options(args)
    opts.validate()
    check_output_file(args.json, "--json")
    check_output_file(args.csv, "--csv")
    console = make_console()

    def env(servers: JSONObject) -> Env:
        return collect_env(lab=False, extra={
            "src": opts.src, "dst": opts.dst, "mode": opts.mode,
            "placement": {"cpu_min": opts.cpu_min, "cpu_max": opts.cpu_max,
                          "pin_off": opts.pin_off, "rx_app_cpu": opts.rx_app_cpu,
                          "tx_app_cpu": opts.tx_app_cpu},
            "servers": servers})

    try:
        with contextlib.ExitStack() as stack:
            for host in args.ssh:
                remote = stack.enter_context(RemoteServer(
                    host, port=args.ssh_port, ssh=args.ssh_cmd, python=args.ssh_python,
                    listen=args.ssh_listen))
                opts.tokens[host] = remote.token
            with console.status(f"{opts.flows} flow(s), {opts.mode}, {opts.duration:g} s ..."):
                result = client.run(opts)
    except KeyboardInterrupt:
        # The flows report only at their end: an interrupted run has no figures to keep, but
        # its file says so rather than keeping an older run's results or nothing.
        if args.json:
            doc = envelope("client", env({}), [])
            doc.complete, doc.reason = False, "interrupted before the flows reported"
            write_json(args.json, doc)
        print("zcnet: interrupted: no flow had reported"
              + (f"; {args.json} marks the run incomplete" if args.json else ""),
              file=sys.stderr)
        return 130
    print_tables(console, tables(result))
    if args.json:
        doc = envelope("client", env(dict(result.hosts)), result.flows)
        doc.summary, doc.cpus, doc.options = result.summary, result.cpus, result.options
        doc.complete = True
        write_json(args.json, doc)
    if args.csv:
        write_text(args.csv, flows_csv(result.flows))
    return 0 if result.summary.ok == result.summary.flows else 1


def flows_csv(flows: list[ResultRow]) -> str:
    """One row per flow, its JSON fields; nested objects (tcp_tx, tcp_rx) become
    ``tcp_tx.retrans`` columns."""
    rows = []
    for f in flows:
        row: dict[str, JSONValue] = {}
        flow = to_json(f)
        assert isinstance(flow, dict)
        for k, v in flow.items():
            if isinstance(v, dict):
                row.update({f"{k}.{kk}": vv for kk, vv in v.items()})
            else:
                row[k] = v
        rows.append(row)
    headers = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, headers, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _fmt(v: int | float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _perf(f: ResultRow, rr: bool) -> list[str]:
    """A flow's rate (and latency percentiles): n/a for a failed flow, whose figures were not
    measured (never 0)."""
    if not rr:
        return [_fmt(f.gbps) if f.ok else "n/a"]
    lat = f.latency or Latency()
    return [_fmt(v, digits) if f.ok else "n/a"
            for v, digits in ((f.tps, 0), *((p, 2) for _, p in lat.percentiles()))]


def _zero_copy(f: ResultRow) -> str:
    """A flow's zero-copy share: ``-`` for a copying engine, ``?`` unknown (a note says why)."""
    if not f.tracks_copies() or not f.ok:
        return "-" if f.ok else "n/a"
    share = f.zero_copy_share()
    return f"{share:.0f}" if share is not None else "?"


def tables(result: ClientResult) -> list[Table]:
    s = result.summary
    rr = s.mode == "rr"
    heads = ["flow", "status", "rx cpu", "rx app", "tx cpu", "tx app"]
    heads += (["tps", *(f"{label} us" for label, _ in Latency().percentiles())] if rr
              else ["Gbit/s"])
    copies = any(f.tracks_copies() for f in result.flows)
    heads += ["zc %"] * copies + ["retrans", "rtt us", "cwnd"]
    rows = []
    notes = []
    for f in result.flows:
        tcp = f.tcp_tx
        rows.append([str(f.flow), f.status, _fmt(f.rx_cpu), _fmt(f.rx_app_cpu),
                     _fmt(f.tx_cpu), _fmt(f.tx_app_cpu), *_perf(f, rr),
                     *[_zero_copy(f)] * copies,
                     _fmt(tcp.retrans if tcp else None), _fmt(tcp.rtt_us if tcp else None),
                     _fmt(tcp.snd_cwnd if tcp else None)])
        if f.reason:
            notes.append(f"warning: flow {f.flow}: {f.reason}")
        if f.ok and (why := f.zero_copy_reason()):
            notes.append(f"flow {f.flow}: zero-copy share unknown: {why}")

    def us(value: float | None) -> str:
        return f"{value:.1f} us" if value is not None else "n/a"

    lat = s.latency or Latency()
    total = (f"total {s.tps or 0:.0f} tps, p50 {us(lat.p50_us)}, p99 {us(lat.p99_us)}" if rr
             else f"total {s.gbps or 0:.2f} Gbit/s")
    notes.insert(0, f"{total} over {s.ok}/{s.flows} flows")
    notes.append("rx/tx cpu: the CPU that ran each end's receive softirq (SO_INCOMING_CPU); "
                 "rx/tx app: the CPU each application was pinned to (- not pinned); retrans, "
                 "rtt, cwnd: the sender's TCP_INFO"
                 + ("; zc %: of the bytes received, the share the kernel did not copy (its own "
                    "counter; - a copying engine, ? unknown)" if copies else ""))
    out = [Table("flows", heads, rows, notes, compact=True)]
    cpu_rows = []
    shares = [sh for cpus in result.cpus.values() for sh in cpus.values()]
    columns = mpstat_columns(shares)
    for side, cpus in result.cpus.items():
        for cpu, sh in sorted(cpus.items(), key=lambda kv: int(kv[0])):
            cpu_rows.append([side, cpu, ",".join(sh.roles) or "-",
                             *(fmt_share(sh.share(k)) for k, _ in columns)])
    out.append(Table("per-CPU (/proc/stat over the run)",
                     ["side", "cpu", "roles", *(h for _, h in columns)], cpu_rows,
                     [mpstat_legend(columns, [sh for sh in shares if sh.sampled])],
                     compact=True))
    return out
