"""``zcnet client``: orchestrate flows between two servers without carrying traffic itself.

For each flow the client asks the destination server to open a receiving end, the source server
to connect a sending end to it, and the destination for the CPU the connection's packets arrive
on (SO_INCOMING_CPU after accept). If that CPU is outside ``cpu_min..cpu_max`` the flow is closed
and connected again, as kperf does, until it lands where wanted. ``pin_off`` K then pins each
application end on its socket's receive CPU + K (0: same core as the softirq, 1: its neighbour).
When every flow is placed, both servers start at once, and their results are merged per flow.

Some facts about SO_INCOMING_CPU: the kernel records, on every packet it delivers to a socket, the
CPU that ran the receive path; read right after accept it names the CPU of the handshake's last
ACK, which on a NIC is the RSS queue's IRQ CPU, on veth and loopback the sending process's CPU.
So on this machine the discovery loop retries until the sender happened to run on a wanted CPU.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from zcnet.bench import proto
from zcnet.bench.control import Control
from zcnet.bench.endpoint import parse_hostport
from zcnet.bench.hist import merge_encoded, summarize
from zcnet.bench.proto import (
    GRACE,
    Budget,
    LimitExceeded,
    Message,
    OptionValue,
    ProtocolError,
    buffer_sizes,
    get,
)
from zcnet.bench.records import (
    ClientSummary,
    FlowEnd,
    RecordError,
    ResultRow,
    RoleShares,
    RunResults,
    TcpDelta,
    parse,
    to_json,
)
from zcnet.bench.remote import NetnsServer
from zcnet.errors import UsageError, ZcnetError
from zcnet.jsonvalue import JSONObject
from zcnet.lab import Lab
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import engine_names

log = logging.getLogger(__name__)

MAX_SIZE = proto.MAX_SIZE   # one buffer; the server's limits are usually lower


@dataclass
class ClientOptions:
    src: str = "127.0.0.1"           # control address of the sending side's server, HOST[:PORT]
    dst: str = "127.0.0.1"           # control address of the receiving side's server
    data_host: str | None = None     # where flows connect on dst (default: dst's host)
    data_port: int | None = None     # fixed receiving port (one a NIC flow rule steers)
    mode: str = "stream"             # "stream" | "rr"
    flows: int = 1
    duration: float = 5.0
    rx_engine: str = "epoll"
    engine_opts: dict[str, OptionValue] = field(default_factory=dict)  # EngineOptions' names
    verify: bool = False              # stream: check every byte received against the pattern
    tx: str = "copy"
    read_size: int = 1 << 20
    write_size: int = 1 << 20
    req_size: int = 1
    resp_size: int = 1
    cpu_min: int | None = None
    cpu_max: int | None = None
    pin_off: int | None = None
    rx_app_cpu: int | None = None     # absolute pins; each overrides pin_off for its end
    tx_app_cpu: int | None = None
    tokens: dict[str, bytes] = field(default_factory=dict)  # control host -> token
    token: bytes | None = None        # for hosts not in ``tokens``; None: this user's file
    max_attempts: int = 64
    netns: str | None = None          # reach the servers from inside this namespace (a lab)
    # Called with the placed flows right after start (tests use it to inject faults).
    on_started: Callable[[list[ResultRow]], None] | None = None

    def validate(self) -> None:
        if self.mode not in proto.MODES:
            raise UsageError(f"unknown mode {self.mode!r}", f"use one of {list(proto.MODES)}")
        if not 1 <= self.flows <= 1024:
            raise UsageError(f"{self.flows} flows", "use -n 1..1024")
        if self.data_port is not None and not 1 <= self.data_port <= 65536 - self.flows:
            raise UsageError(f"--data-port {self.data_port} out of range",
                             f"use 1..{65536 - self.flows} (flow N listens on PORT+N)")
        # The protocol's range for a run's duration (start.duration), so the server never
        # refuses what the client let through; "not lo <= v <= hi" refuses NaN too.
        lo, hi = proto.DURATION
        if not lo <= self.duration <= hi:
            raise UsageError(f"duration {self.duration} s out of range",
                             f"use -t from {lo:g} to {hi:g} seconds")
        for name in ("read_size", "write_size", "req_size", "resp_size"):
            if not 1 <= getattr(self, name) <= MAX_SIZE:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)} out of range",
                                 f"give a size from 1 byte to {MAX_SIZE >> 30} GiB")
        for name in ("cpu_min", "cpu_max", "rx_app_cpu", "tx_app_cpu", "pin_off"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= proto.CPU.hi:
                raise UsageError(f"--{name.replace('_', '-')} {value} out of range",
                                 "give a CPU number (0 is the first CPU)" if name != "pin_off"
                                 else "give an offset >= 0 (0 pins on the RX CPU itself)")
        if (self.cpu_min is not None and self.cpu_max is not None
                and self.cpu_min > self.cpu_max):
            raise UsageError("--cpu-min is above --cpu-max", "swap them")
        if not 1 <= self.max_attempts <= 10000:
            raise UsageError(f"--max-attempts {self.max_attempts} out of range",
                             "give 1..10000 connections per flow")
        self._check_requests()

    def _check_requests(self) -> None:
        """What the client will send, checked against the protocol's schema now: a bad engine
        name, option or data host is a usage error here, not a refusal mid-run."""
        for msg in (_open_msg(self, 0),
                    _connect_msg(self, 0, self.data_host or "127.0.0.1", 1)):
            try:
                proto.validate(msg)
            except ProtocolError as e:
                where, _, what = e.message.partition(": ")
                option, attr, hint = _REQUEST_FIELDS.get(where, (where, "", "see --help"))
                value = f" {getattr(self, attr)!r}" if attr else ""
                raise UsageError(f"{option}{value}: {what}", hint) from None
        EngineOptions.from_mapping(self.engine_opts)  # names and types, before any server runs

    def check_cpus(self, side: str, cpus: int) -> None:
        """CPU numbers against the server that runs them (``cpus`` from its welcome)."""
        names = (("cpu_min", "rx_app_cpu") if side == "dst" else ("tx_app_cpu",))
        for name in names:
            value = getattr(self, name)
            if value is not None and value >= cpus:
                raise UsageError(f"--{name.replace('_', '-')} {value}: the {side} server has "
                                 f"{cpus} CPUs", f"give a CPU from 0 to {cpus - 1}")

    def wanted(self, cpu: int) -> bool:
        return ((self.cpu_min is None or cpu >= self.cpu_min)
                and (self.cpu_max is None or cpu <= self.cpu_max))


# Request fields the client fills from options: (option, what it takes).
_REQUEST_FIELDS = {
    "open.engine": ("--rx-engine", "rx_engine", f"one of {', '.join(engine_names())}"),
    "open.engine_opts": ("--rx-opt", "engine_opts", "KEY=VALUE, KEY a lowercase word; VALUE an "
                         "integer within +-2^40, true/false, or a plain word such as eth1 or "
                         "1,2 (at most 16 options)"),
    "connect.tx": ("--tx", "tx", "a send path, e.g. copy, msgzc, sendzc"),
    "connect.host": ("--data-host", "data_host", "an IP address or host name"),
}


# ---- the run -----------------------------------------------------------------------------------

@dataclass
class ClientResult:
    flows: list[ResultRow]
    summary: ClientSummary
    cpus: dict[str, dict[str, RoleShares]]  # side ("src"/"dst", or "host" if one) -> CPU -> ...
    options: JSONObject
    hosts: dict[str, JSONObject] = field(default_factory=dict)  # side -> server's env

    def side_cpus(self, side: str) -> dict[str, RoleShares]:
        """The shares on ``side`` (dst or src) by CPU: the one server's when src is dst."""
        return self.cpus.get(side, self.cpus.get("host", {}))


def _token_for(opts: ClientOptions, addr: str) -> bytes | None:
    host, _ = parse_hostport(addr)
    return opts.tokens.get(host, opts.tokens.get(addr, opts.token))


def run(opts: ClientOptions) -> ClientResult:
    opts.validate()
    same = parse_hostport(opts.src) == parse_hostport(opts.dst)
    with contextlib.ExitStack() as stack:
        dst = Control(opts.dst, _token_for(opts, opts.dst), opts.netns)
        stack.callback(dst.close)
        controls = [dst]
        if same:
            src = dst
        else:
            src = Control(opts.src, _token_for(opts, opts.src), opts.netns)
            stack.callback(src.close)
            controls.append(src)
        opts.check_cpus("dst", dst.cpus)
        opts.check_cpus("src", src.cpus)
        _check_limits(opts, src, dst)
        placed = [_place(opts, src, dst, i) for i in range(opts.flows)]
        for c in reversed(controls):  # receivers (dst) were started first, by convention
            c.send({"type": "start", "duration": float(opts.duration)})
        if opts.on_started:
            opts.on_started(placed)
        wait = opts.duration + GRACE + 15
        replies = {id(c): _results(c, c.receive(wait)) for c in controls}
        result = _merge(opts, placed, replies[id(src)], replies[id(dst)], same)
        result.hosts = {"src": src.env, "dst": dst.env}
        return result


def _results(control: Control, msg: Message) -> RunResults:
    """A server's ``results`` as the record (the protocol has checked every field of it)."""
    try:
        return parse(RunResults, msg)
    except RecordError as e:
        raise ZcnetError(f"server {control.addr}: bad results: {e}") from None


def _open_msg(opts: ClientOptions, flow: int) -> Message:
    msg: Message = {"type": "open", "flow": flow, "mode": opts.mode, "engine": opts.rx_engine,
                    "read_size": opts.read_size, "req_size": opts.req_size,
                    "resp_size": opts.resp_size}
    if opts.engine_opts:
        msg["engine_opts"] = dict(opts.engine_opts)
    if opts.verify:
        msg["verify"] = True
    if opts.data_port:
        msg["port"] = opts.data_port + flow
    return msg


def _connect_msg(opts: ClientOptions, flow: int, host: str, port: int) -> Message:
    msg: Message = {"type": "connect", "flow": flow, "host": host, "port": port,
                    "mode": opts.mode, "tx": opts.tx, "write_size": opts.write_size,
                    "req_size": opts.req_size, "resp_size": opts.resp_size}
    if opts.verify:
        msg["verify"] = True
    return msg


def _check_limits(opts: ClientOptions, src: Control, dst: Control) -> None:
    """Every request of the run charged against each server's limits (from its welcome), the
    way the server will: a run it would refuse half-way is refused before any flow starts.
    Reconnecting a flow closes it first, so one attempt per flow is the whole budget."""
    start: Message = {"type": "start", "duration": float(opts.duration)}
    host = opts.data_host or dst.host
    plans: dict[int, tuple[Control, list[Message]]] = {
        id(dst): (dst, [_open_msg(opts, i) for i in range(opts.flows)])}
    plans.setdefault(id(src), (src, []))[1].extend(
        _connect_msg(opts, i, host, 1) for i in range(opts.flows))
    for control, plan in plans.values():
        budget = Budget(control.limits)
        for msg in [*plan, start]:
            try:
                budget.check(msg)
            except LimitExceeded as e:
                need = sum(sum(buffer_sizes(m)) for m in plan)
                raise _over_limit(opts, control.addr, e, need) from None
            budget.record(msg)


def _over_limit(opts: ClientOptions, addr: str, e: LimitExceeded, need: int) -> UsageError:
    """The refusal ``e`` a server at ``addr`` would give, said in the client's options."""
    server = f"the server at {addr}"
    buffers = "--read-size/--write-size (--req-size/--resp-size with --rr) or the engine's " \
              "area/ring options"
    if e.limit == "max_flows":
        return UsageError(f"-n {opts.flows}: {server} allows at most {int(e.allowed)} flows "
                          "per session", f"use -n {int(e.allowed)} or fewer, or start that "
                          "server with a higher --max-flows")
    if e.limit == "max_duration":
        return UsageError(f"-t {opts.duration:g}: {server} allows runs of at most "
                          f"{e.allowed:g} s", f"use -t {e.allowed:g} or less, or start that "
                          "server with a higher --max-duration")
    if e.limit == "max_buffer":
        return UsageError(f"a buffer of {int(e.asked)} bytes: {server} allows at most "
                          f"{int(e.allowed)} bytes per buffer", f"lower {buffers}")
    return UsageError(f"{opts.flows} flow(s) need {need} bytes of buffers on {server}, which "
                      f"allows {int(e.allowed)} bytes per session", f"use fewer flows, lower "
                      f"{buffers}, or start that server with a higher --max-memory")


def _place(opts: ClientOptions, src: Control, dst: Control, flow: int) -> ResultRow:
    """Open, connect and probe one flow until its RX CPU is wanted; then pin it."""
    data_host = opts.data_host or dst.host
    for attempt in range(1, opts.max_attempts + 1):
        opened = dst.request(_open_msg(opts, flow))
        connected = src.request(_connect_msg(opts, flow, data_host, get(opened, "port", int)))
        rx_cpu = get(dst.request({"type": "probe", "flow": flow}), "cpu", int)
        if opts.wanted(rx_cpu):
            break
        log.info("flow %d landed on CPU %d, reconnecting (attempt %d)", flow, rx_cpu, attempt)
        src.request({"type": "close", "flow": flow})
        if dst is not src:
            dst.request({"type": "close", "flow": flow})
    else:
        raise ZcnetError(f"flow {flow}: no connection landed on CPUs "
                         f"{opts.cpu_min}..{opts.cpu_max} in {opts.max_attempts} attempts",
                         "widen --cpu-min/--cpu-max, or steer flows (RSS/ntuple) to those CPUs")
    tx_cpu = get(connected, "cpu", int)
    row = ResultRow(flow=flow, attempts=attempt, rx_cpu=rx_cpu, tx_cpu=tx_cpu,
                    rx_pid=get(opened, "pid", int), tx_pid=get(connected, "pid", int),
                    mode=opts.mode, engine=opts.rx_engine, tx=opts.tx)
    rx_pin, tx_pin = opts.rx_app_cpu, opts.tx_app_cpu
    if opts.pin_off is not None:
        if rx_pin is None and rx_cpu >= 0:   # -1: the kernel recorded no CPU
            rx_pin = (rx_cpu + opts.pin_off) % dst.cpus
        if tx_pin is None and tx_cpu >= 0:
            tx_pin = (tx_cpu + opts.pin_off) % src.cpus
    if rx_pin is not None:
        row.rx_app_cpu = get(dst.request({"type": "pin", "flow": flow, "role": "rx",
                                          "cpu": rx_pin}), "cpu", int)
    if tx_pin is not None:
        row.tx_app_cpu = get(src.request({"type": "pin", "flow": flow, "role": "tx",
                                          "cpu": tx_pin}), "cpu", int)
    return row


# The TCP_INFO a flow row keeps of each end.
_TCP_TX = ("retrans", "reord_seen", "rtt_us", "min_rtt_us", "snd_cwnd", "reordering",
           "bytes_retrans")
_TCP_RX = ("rcv_ooopack", "rtt_us")


def _only(tcp: TcpDelta | None, names: tuple[str, ...]) -> TcpDelta:
    return TcpDelta(**{k: getattr(tcp, k) if tcp is not None else None for k in names})


def _merge(opts: ClientOptions, placed: list[ResultRow], src_res: RunResults,
           dst_res: RunResults, same: bool) -> ClientResult:
    def by(res: RunResults, role: str) -> dict[int, FlowEnd]:
        return {f.flow: f for f in res.flows if f.role == role}

    rx, tx = by(dst_res, "rx"), by(src_res, "tx")
    for row in placed:
        assert row.flow is not None
        got_r, got_t = rx.get(row.flow), tx.get(row.flow)
        errors = [e.reason for e in (got_r, got_t) if e is not None and e.status != "ok"]
        if got_r is None or got_t is None:
            errors.append("missing result")
        r = got_r or FlowEnd(flow=row.flow, role="rx")  # missing: its figures read absent
        t = got_t or FlowEnd(flow=row.flow, role="tx")
        row.status, row.reason = ("error" if errors else "ok"), "; ".join(errors)
        # SO_INCOMING_CPU again at the end: on veth/loopback it follows the sender around.
        row.rx_cpu_end, row.tx_cpu_end = r.cpu_end, t.cpu_end
        if opts.mode == "stream":
            nbytes, secs = r.bytes or 0, r.seconds or 0.0
            row.bytes, row.seconds, row.bytes_sent = nbytes, secs, t.bytes_sent
            row.gbps = round(nbytes * 8 / secs / 1e9, 3) if secs else 0.0
            row.tx_stats, row.engine_stats, row.syscalls = t.tx_stats, r.engine_stats, r.syscalls
            row.verify, row.intervals = r.verify, r.intervals
            if row.verify is not None and row.verify.mismatches:
                row.status = "error"
                row.reason = f"{row.verify.mismatches} bytes differ from the sent pattern"
            elif row.verify is not None and row.verify.checked_bytes != nbytes:
                row.status, row.reason = "error", "verifier saw fewer bytes than were received"
        else:
            n, secs = t.transactions or 0, t.seconds or 0.0
            row.transactions, row.seconds = n, secs
            row.tps = round(n / secs, 1) if secs else 0.0
            row.latency, row.samples = t.latency, t.samples
        row.tcp_tx, row.tcp_rx = _only(t.tcp, _TCP_TX), _only(r.tcp, _TCP_RX)
    ok = [f for f in placed if f.ok]
    summary = ClientSummary(flows=len(placed), ok=len(ok), mode=opts.mode)
    if opts.mode == "stream":
        summary.gbps = round(sum(f.gbps or 0.0 for f in ok), 3)
    else:
        summary.tps = round(sum(f.tps or 0.0 for f in ok), 1)
        if src_res.hist:   # the sending session merged its flows' histograms
            merged = merge_encoded([src_res.hist])
            summary.latency, summary.samples = summarize(merged), merged.get_total_count()
    if same:  # one server, one set of CPUs: label with both ends
        cpus = {"host": _side_cpus(dst_res, placed, ("rx", "tx"))}
    else:
        cpus = {"dst": _side_cpus(dst_res, placed, ("rx",)),
                "src": _side_cpus(src_res, placed, ("tx",))}
    options = {k: to_json(v) for k, v in vars(opts).items()
               if k not in ("tokens", "token", "on_started")}
    return ClientResult(placed, summary, cpus, options)


@dataclass
class LabServers:
    """A server in each namespace of a lab, and what a client needs to drive them."""

    src: str
    dst: str
    tokens: dict[str, bytes]
    netns: str | None  # where the client reaches them from (None: here)

    def options(self, opts: ClientOptions) -> ClientOptions:
        """``opts`` aimed at these servers."""
        return replace(opts, src=self.src, dst=self.dst, tokens=self.tokens, netns=self.netns)


@contextlib.contextmanager
def lab_servers(lab: Lab) -> Iterator[LabServers]:
    """``with lab_servers(lab) as ls: run(ls.options(ClientOptions(flows=2)))``: the lab's
    sending side
    (``ns_a``) and receiving side (``ns_b``) each get a server (with a fresh token, as any
    non-loopback listener must), stopped when the block ends."""
    with NetnsServer(lab.addr_a, netns=lab.ns_a) as a, NetnsServer(lab.addr_b, netns=lab.ns_b) as b:
        assert a.address and b.address
        yield LabServers(a.address, b.address, {lab.addr_a: a.token, lab.addr_b: b.token},
                         lab.ns_a)


def _side_cpus(res: RunResults, placed: list[ResultRow],
               ends: tuple[str, ...]) -> dict[str, RoleShares]:
    """Shares per watched CPU, labelled with what ran there (softirq, application)."""
    roles: dict[str, set[str]] = {}
    for p in placed:
        for role in ends:
            softirq, app = (p.rx_cpu, p.rx_app_cpu) if role == "rx" else (p.tx_cpu, p.tx_app_cpu)
            for cpu, label in ((softirq, f"{role}-softirq"), (app, f"{role}-app")):
                if cpu is not None and cpu >= 0:
                    roles.setdefault(str(cpu), set()).add(label)
    return {cpu: RoleShares(**vars(shares), roles=sorted(roles.get(cpu, ())))
            for cpu, shares in res.cpus.items()}
