"""txbench: a pktgen-like UDP single-stream generator, one row per mode and repeat.

``run_txbench()`` sends from this thread, one mode after the other, into a :class:`Sink` process
in the lab's other namespace (or on loopback, or to a user-given address with no sink), and
returns the shared JSON envelope (``kind = "txbench"``). Rows carry the fields the report layer
keys on (``mode``, ``payload``, ``burst``, ``repeat``) and the metrics it knows (``mpps``,
``ns_per_pkt``, ``instructions_per_pkt``, ``cycles_per_pkt``); ``summary`` holds mean ± stdev
per mode and the ratio to ``single``.

CPU per packet is this thread's CPU time (user + system, ``time.thread_time``) over the packets it
sent: on loopback and veth that includes the kernel's delivery to the receiving socket, which runs
in the sender's softirq context.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from zcnet import quantities
from zcnet.bench.meta import Interrupted, collect_env, envelope
from zcnet.bench.records import MeanSd, ModeSummary, ResultFile, ResultRow
from zcnet.errors import Unsupported, UsageError, ZcnetError
from zcnet.jsonvalue import JSONObject, JSONValue
from zcnet.lab import Lab
from zcnet.lab.sweep import before_run
from zcnet.netns import in_netns
from zcnet.nic.info import nic_env
from zcnet.tx.hwcount import NO_COUNTERS, HwCounters
from zcnet.tx.sink import Sink
from zcnet.tx.udp_modes import MODES, BurstSender, SenderFactory, run_for
from zcnet.uapi.errqueue import IP_MTU, IPV6_MTU
from zcnet.uapi.socket import SO_SNDBUFFORCE

ALL_MODES = ("single", "mmsg", "uring", "gso")
BASELINE = "single"
# Send paths txbench cannot measure, and why; every document says so ("not_measured").
NOT_MEASURED = {
    "devmem": "devmem TX is TCP-only in the kernel (only tcp_sendmsg reads SCM_DEVMEM_DMABUF) "
              "and txbench sends UDP: measure it with `zcnet bench --tx devmem`",
}
_HEADERS = {socket.AF_INET: 20 + 8, socket.AF_INET6: 40 + 8}
_SNDBUF = 4 << 20
_QUIET_MS = 60
_WARMUP_S = 0.1


@dataclass(frozen=True)
class UdpDestination:
    """Where txbench's UDP packets go: an address and port, and the namespace the sender's
    socket lives in."""

    addr: str
    port: int
    sender_netns: str | None = None

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ":" in self.addr else socket.AF_INET


def parse_dst(text: str) -> tuple[str, int]:
    """``ADDR:PORT`` or ``[ADDR6]:PORT``."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise UsageError(f"bad --dst {text!r}", "give ADDR:PORT or [ADDR6]:PORT") from None
    if not sep or not 0 < number < 65536:
        raise UsageError(f"bad --dst {text!r}", "give ADDR:PORT with a port in 1..65535")
    return host, number


def _uring_factory(sock: socket.socket, lengths: Sequence[int]) -> BurstSender:
    try:
        # Kept here: the io_uring sender is the one mode that may be missing from a build
        # (ImportError), and the other modes must still run.
        from zcnet.tx.uring_send import UringSender
    except ImportError as exc:
        raise Unsupported(f"io_uring send is not available: {exc}") from exc
    return UringSender(sock, lengths)


def _factory(mode: str) -> SenderFactory:
    return _uring_factory if mode == "uring" else MODES[mode]


def open_sender(dest: UdpDestination) -> socket.socket:
    """A connected, non-blocking UDP socket in the dest's sender namespace."""
    with in_netns(dest.sender_netns):
        sock = socket.socket(dest.family, socket.SOCK_DGRAM)
    try:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, _SNDBUF)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
        sock.connect((dest.addr, dest.port))
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ZcnetError(f"cannot reach {dest.addr}:{dest.port}: {exc.strerror}",
                         "check the address, and that a route to it exists") from exc
    return sock


def path_payload_limit(sock: socket.socket) -> int:
    """Largest UDP payload that leaves as one unfragmented packet on this connected socket."""
    if sock.family == socket.AF_INET6:
        mtu = sock.getsockopt(socket.IPPROTO_IPV6, IPV6_MTU)
    else:
        mtu = sock.getsockopt(socket.IPPROTO_IP, IP_MTU)
    return mtu - _HEADERS[sock.family]


# One burst's payload buffer, allocated per mode: bounded so that a large burst of large
# packets is a usage error, not an out-of-memory kill.
MAX_BURST_BYTES = 256 << 20


def burst_lengths(size: int, burst: int, sizes: Sequence[int] | None) -> list[int]:
    """The lengths of one burst: ``size`` each, or ``sizes`` repeated across the burst."""
    quantities.check("burst", burst, "--burst")
    pattern = list(sizes) if sizes else [size]
    if not pattern:
        raise UsageError("--sizes is empty", "give sizes like 64,64,128")
    for n in pattern:
        quantities.check("payload", n, "payload size (--size/--sizes)")
    lengths = [pattern[i % len(pattern)] for i in range(burst)]
    if burst * max(lengths) > MAX_BURST_BYTES:
        raise UsageError(f"a burst of {burst} x {max(lengths)} B needs more than "
                         f"{MAX_BURST_BYTES >> 20} MiB of buffers",
                         "use a smaller --burst or --size")
    return lengths


def _mean_sd(values: list[float]) -> MeanSd:
    if not values:
        return MeanSd()
    return MeanSd(mean=statistics.fmean(values),
                  stdev=statistics.stdev(values) if len(values) > 1 else 0.0)


def _measure(sender: BurstSender, sink: Sink | None, hw: HwCounters | None,
             seconds: float | None, packets: int | None) -> ResultRow:
    before = sink.snapshot(_QUIET_MS) if sink else None
    c = sender.counters
    fb0, calls0, retries0 = c.fallback_packets, c.calls, sum(c.retries.values())
    if hw:
        hw.start()
    sent, wall, cpu = run_for(sender, None if packets else seconds, packets)
    counts = hw.stop() if hw else None
    row = ResultRow(
        sent=sent,
        seconds=wall,
        mpps=sent / wall / 1e6 if wall > 0 else 0.0,
        ns_per_pkt=cpu * 1e9 / sent if sent else None,
        calls_per_pkt=(c.calls - calls0) / sent if sent else None,
        fallback_packets=c.fallback_packets - fb0,
        retries=sum(c.retries.values()) - retries0,
        instructions_per_pkt=counts["instructions"] / sent if counts and sent else None,
        cycles_per_pkt=counts["cycles"] / sent if counts and sent else None,
    )
    if sink and before is not None:
        after = sink.snapshot(_QUIET_MS)
        row.received = after["received"] - before["received"]
        row.bad_payload = after["bad_payload"] - before["bad_payload"]
        row.wrong_size = after["wrong_size"] - before["wrong_size"]
        row.drops = sent - row.received
        row.seq_sum = after["seq_sum"] - before["seq_sum"]
    return row


def _total(ok: list[ResultRow], values: list[int | None]) -> int | None:
    """A count summed over a mode's rows, or None unless every row has it."""
    return sum(v for v in values if v is not None) if None not in values and ok else None


def _summarize(rows: list[ResultRow], modes: Sequence[str]) -> dict[str, ModeSummary]:
    out: dict[str, ModeSummary] = {}
    for mode in modes:
        mine = [r for r in rows if r.mode == mode]
        ok = [r for r in mine if r.ok]
        if not ok:
            out[mode] = (ModeSummary(status=mine[0].status, reason=mine[0].reason) if mine
                         else ModeSummary(status="missing", reason="not measured"))
            continue

        def stat(values: list[float | None]) -> MeanSd:
            return _mean_sd([v for v in values if v is not None])

        out[mode] = ModeSummary(
            status="ok", mpps=stat([r.mpps for r in ok]),
            ns_per_pkt=stat([r.ns_per_pkt for r in ok]),
            instructions_per_pkt=stat([r.instructions_per_pkt for r in ok]),
            cycles_per_pkt=stat([r.cycles_per_pkt for r in ok]),
            sent=_total(ok, [r.sent for r in ok]), received=_total(ok, [r.received for r in ok]),
            drops=_total(ok, [r.drops for r in ok]),
            bad_payload=_total(ok, [r.bad_payload for r in ok]),
            wrong_size=_total(ok, [r.wrong_size for r in ok]),
            fallback_packets=_total(ok, [r.fallback_packets for r in ok]),
            retries=_total(ok, [r.retries for r in ok]),
            notes=sorted({n for r in ok for n in r.notes}))
    base_mode = out.get(BASELINE)
    base = base_mode.mpps.mean if base_mode is not None and base_mode.mpps else None
    for entry in out.values():
        mean = entry.mpps.mean if entry.status == "ok" and entry.mpps else None
        entry.vs_single = mean / base if base and mean is not None else None
    return out


def run_txbench(*, modes: Sequence[str] = ALL_MODES, size: int = 64, burst: int = 32,
                sizes: Sequence[int] | None = None, duration: float | None = 1.0,
                packets: int | None = None, repeat: int = 5, dst: str | None = None,
                lab: bool = True, mtu: int = 1500, ipv6: bool = False) -> ResultFile:
    """Measure each mode ``repeat`` times; returns the ``txbench`` JSON envelope.

    Traffic goes into a sink in a fresh lab (``lab=True``), to a sink on loopback (``lab=False``),
    or to ``dst`` ("ADDR:PORT", no sink: received counts are absent). ``packets`` sends exactly
    that many per repeat (rounded down to whole bursts) instead of running for ``duration``.
    """
    unknown = [m for m in modes if m not in ALL_MODES]
    if unknown and unknown[0] in NOT_MEASURED:
        raise UsageError(f"txbench cannot measure {unknown[0]}: {NOT_MEASURED[unknown[0]]}",
                         f"choose from {','.join(ALL_MODES)}")
    if unknown:
        raise UsageError(f"unknown txbench mode {unknown[0]!r}", f"choose from {ALL_MODES}")
    if not modes or len(set(modes)) != len(modes):
        raise UsageError(f"modes {','.join(modes)!r}: give each mode once, at least one",
                         f"choose from {','.join(ALL_MODES)}")
    quantities.check("repeat", repeat, "--repeat")
    if packets is None:
        quantities.check("duration", duration, "--duration")
    else:
        quantities.check("packets", packets, "--packets")
    if lab and dst is None:
        quantities.check("mtu", mtu, "--mtu")
    if packets is not None and packets < burst:
        raise UsageError(f"packets ({packets}) must be at least one burst ({burst})",
                         f"use --packets {burst} or more, or a smaller --burst")
    lengths = burst_lengths(size, burst, sizes)
    if dst is not None:
        parse_dst(dst)  # a bad address fails before anything is set up
    shape = tuple(sorted(set(lengths)))
    cell = ResultRow(payload=size if sizes is None else ",".join(map(str, sizes)), burst=burst)
    with contextlib.ExitStack() as stack:
        sink: Sink | None = None
        target: JSONValue = None
        nic: JSONObject | None = None
        lab_env: JSONObject = {}
        if dst is not None:
            addr, port = parse_dst(dst)
            dest = UdpDestination(addr, port)
            target = dst
        elif lab:
            before_run()  # stale labs go; others are announced (log warnings)
            the_lab = stack.enter_context(Lab(mtu=mtu, ipv6=ipv6))
            bind = the_lab.addr6_b if ipv6 else the_lab.addr_b
            if bind is None:
                raise Unsupported("IPv6 is not available in the lab", "run without --ipv6")
            sink = stack.enter_context(
                Sink(bind, shape, spawn=functools.partial(the_lab.ns_exec, the_lab.ns_b)))
            dest = UdpDestination(bind, sink.port, sender_netns=the_lab.ns_a)
            lab_env = {k: v for k, v in the_lab.env().items() if k != "lab"}
            nic = nic_env(the_lab.if_a, the_lab.ns_a)  # the sending interface
        else:
            bind = "::1" if ipv6 else "127.0.0.1"
            sink = stack.enter_context(Sink(bind, shape))
            dest = UdpDestination(bind, sink.port)
            target = "loopback"
            nic = nic_env("lo")
        hw = HwCounters.open()
        if hw:
            stack.callback(hw.close)
        env = collect_env(lab=dst is None and lab, target=target, nic=nic,
                          hw_counters="yes" if hw else NO_COUNTERS, extra=lab_env)
        by_mode: dict[str, list[ResultRow]] = {mode: [] for mode in modes}

        def document(complete: bool) -> ResultFile:
            rows = [row for mode in modes for row in by_mode[mode]]
            doc = envelope("txbench", env, rows)
            doc.complete = complete
            doc.summary = _summarize(rows, modes)
            doc.not_measured = NOT_MEASURED
            return doc

        try:
            _run_modes(stack, by_mode, dest, lengths, sink, hw, duration, packets, repeat, cell)
        except KeyboardInterrupt:
            raise Interrupted(document(False)) from None
        return document(True)


def _run_modes(stack: contextlib.ExitStack, rows: dict[str, list[ResultRow]],
               dest: UdpDestination, lengths: list[int], sink: Sink | None, hw: HwCounters | None,
               duration: float | None, packets: int | None, repeat: int,
               cell: ResultRow) -> None:
    """Repeats go round-robin over the modes (A B C A B C ...), so a load change on the machine
    spreads over all modes instead of landing on one; each row is appended to ``rows[mode]``
    as soon as it is measured (an interrupted run keeps them)."""
    senders: dict[str, BurstSender] = {}
    for mode in rows:
        sock = stack.enter_context(contextlib.closing(open_sender(dest)))
        limit = path_payload_limit(sock)
        if max(lengths) > limit:
            raise UsageError(f"payload {max(lengths)} B exceeds the path MTU's limit of {limit} B "
                             f"to {dest.addr}",
                             f"use a payload of {limit} B or less, or raise the MTU")
        try:
            senders[mode] = sender = _factory(mode)(sock, lengths)
        except Unsupported as exc:
            rows[mode] = [replace(cell, mode=mode, repeat=i, status="unsupported",
                                  reason=exc.message) for i in range(repeat)]
            continue
        stack.callback(sender.close)
        if packets is None:
            run_for(sender, seconds=min(_WARMUP_S, duration or _WARMUP_S))
    for i in range(repeat):
        for mode, sender in senders.items():
            row = replace(_measure(sender, sink, hw, duration, packets), mode=mode,
                          payload=cell.payload, burst=cell.burst, repeat=i)
            notes = getattr(sender, "notes", None)
            if notes:
                row.notes = list(notes)
            rows[mode].append(row)
