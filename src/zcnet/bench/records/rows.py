"""A result row: one cell measured once, as every command writes it into ``results`` and every
report reads it back.

One schema for all commands: a ``zcnet bench`` cell (a flow of the client, with the cell's MTU
and placement and the CPU shares of both ends), a C peer run in the same lab, a ``txbench`` mode,
an experiment's cell (any of those, with the matrix's axes), and a ``zcnet client`` flow. A row
carries the fields its command measures; the others are None and absent from the JSON. A field
has the same name at every stage, from the flow worker (``zcnet.bench.records.flow``) to the
file and the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zcnet.bench.records.codec import meta
from zcnet.bench.records.flow import (
    CPU_KEYS,
    FIGURE,
    CpuPair,
    CpuShares,
    EngineStat,
    Intervals,
    Latency,
    TcpDelta,
    Verify,
)
from zcnet.tx.slots import SendStats

# Fields that say *what* was measured; anything else in a row is a measurement or a note.
KEY_FIELDS = ("experiment", "variant", "engine", "mode", "tx", "consumer", "placement", "mtu",
              "payload", "burst", "peer")
AxisValue = str | int   # what a key field holds (an experiment matrix's axis values)
STATUSES = ("ok", "error", "unsupported")


@dataclass(kw_only=True)
class ResultRow:
    flow: int | None = None          # a client run's flow number (first: it names a client row)
    # -- what was measured (``KEY_FIELDS``), and whether it ran ------------------------------------
    experiment: str | None = None
    variant: str | None = None       # the NIC private flag of an A/B: "skb_tx_mpwqe=on"
    engine: str | None = None        # rx engine, or the C peer's name
    mode: str | None = None          # txbench's send mode; a client flow's stream | rr
    tx: str | None = None            # the sender's send path
    consumer: str | None = None      # where zero-copy buffers are released: same | thread
    placement: str | None = None     # same | split
    mtu: int | None = field(default=None, metadata=meta(q="mtu"))
    payload: int | str | None = field(default=None, metadata=meta(q="payload"))  # "64,128"
    burst: int | None = field(default=None, metadata=meta(q="burst"))
    peer: str | None = None          # a C tool run beside the engines (iperf3, sockperf)
    status: str = field(default="ok", metadata=meta(choices=STATUSES))
    reason: str = ""                 # why a row is not ok
    repeat: int | None = None        # which repeat of the cell (0-based)

    # -- one flow: where it ran (a client flow, a bench cell) --------------------------------------
    attempts: int | None = None      # connections until the receive CPU was a wanted one
    rx_pid: int | None = None
    tx_pid: int | None = None
    rx_cpu: int | None = None        # receive softirq's CPU at placement (SO_INCOMING_CPU)
    tx_cpu: int | None = None        # the sender socket's, likewise
    rx_app_cpu: int | None = None    # the CPU each application was pinned to (None: not pinned)
    tx_app_cpu: int | None = None
    rx_cpu_end: int | None = None    # SO_INCOMING_CPU when the flow ended (-1: none recorded)
    tx_cpu_end: int | None = None

    # -- what it measured --------------------------------------------------------------------------
    bytes: int | None = field(default=None, metadata=FIGURE)       # received
    bytes_sent: int | None = field(default=None, metadata=FIGURE)
    seconds: float | None = field(default=None, metadata=FIGURE)
    gbps: float | None = field(default=None, metadata=FIGURE)
    syscalls: int | None = field(default=None, metadata=FIGURE)    # the receiver's
    engine_stats: dict[str, EngineStat] | None = None
    tx_stats: SendStats | None = None
    verify: Verify | None = None
    intervals: Intervals | None = None
    interval_cv: float | None = field(default=None, metadata=FIGURE)  # spread of the intervals
    others_running: float | None = field(default=None, metadata=FIGURE)
    tcp_tx: TcpDelta | None = None
    tcp_rx: TcpDelta | None = None
    transactions: int | None = field(default=None, metadata=FIGURE)
    tps: float | None = field(default=None, metadata=FIGURE)
    latency: Latency | None = field(default=None, metadata=meta(flat=True))
    samples: int | None = field(default=None, metadata=FIGURE)
    cpu: CpuPair | None = None       # shares of the receiving application's and sender's CPU
    cpus: dict[str, CpuShares] | None = field(default=None, metadata=CPU_KEYS)  # every CPU used
    cpu_reason: str | None = None    # why a side of ``cpu`` is n/a
    zcrx_mode: str | None = None     # zcrx: "copy" (the kernel copied) or "device"
    note: str | None = None
    via: str | None = None           # "server": the cell ran through zcnet server and client
    warnings: list[str] = field(default_factory=list, metadata=meta(omit_default=True))

    # -- a C peer (sockperf): its own latency figures (half a round trip) -------------------------
    latency_us: float | None = field(default=None, metadata=FIGURE)
    latency_stdev_us: float | None = field(default=None, metadata=FIGURE)
    latency_p99_us: float | None = field(default=None, metadata=FIGURE)

    # -- txbench: one send mode -------------------------------------------------------------------
    sent: int | None = field(default=None, metadata=FIGURE)
    received: int | None = field(default=None, metadata=FIGURE)
    bad_payload: int | None = None
    wrong_size: int | None = None
    drops: int | None = None
    seq_sum: int | None = None
    mpps: float | None = field(default=None, metadata=FIGURE)
    ns_per_pkt: float | None = field(default=None, metadata=FIGURE)
    calls_per_pkt: float | None = field(default=None, metadata=FIGURE)
    fallback_packets: int | None = None
    retries: int | None = None
    instructions_per_pkt: float | None = field(default=None, metadata=FIGURE)
    cycles_per_pkt: float | None = field(default=None, metadata=FIGURE)
    instructions_per_pkt_reason: str | None = None   # why the counters are n/a
    cycles_per_pkt_reason: str | None = None
    notes: list[str] = field(default_factory=list, metadata=meta(omit_default=True))

    # -- an experiment's cell: bench's send path and consumer where they are not an axis ---------
    tx_path: str | None = None
    consumer_used: str | None = None

    def axis(self, name: str) -> AxisValue | None:
        """A key field by name (``KEY_FIELDS``)."""
        if name not in KEY_FIELDS:
            raise KeyError(name)
        value: AxisValue | None = getattr(self, name)
        return value

    def set_axis(self, name: str, value: AxisValue) -> None:
        if name not in KEY_FIELDS:
            raise KeyError(name)
        setattr(self, name, value)

    def shares_cpu(self, side: str) -> int | None:
        """The CPU whose shares ``cpu.<side>`` are: the application's when it was pinned, else
        the receive softirq's (``side`` rx or tx)."""
        app, softirq = ((self.rx_app_cpu, self.rx_cpu) if side == "rx"
                        else (self.tx_app_cpu, self.tx_cpu))
        return app if app is not None else softirq

    def side_shares(self, side: str) -> CpuShares | None:
        if self.cpu is None:
            return None
        return self.cpu.rx if side == "rx" else self.cpu.tx

    def rx_busy(self) -> float | None:
        """How busy the receiving application's CPU was."""
        shares = self.side_shares("rx")
        return shares.busy_share() if shares is not None else None

    def tracks_copies(self) -> bool:
        """The receiver kept the kernel's copy counters (zero-copy engines); copying engines
        (epoll, io_uring recv) copy every byte by design and keep none."""
        return self.engine_stats is not None and "kernel_copied_source" in self.engine_stats

    def zero_copy_share(self) -> float | None:
        """The share of the received bytes the kernel placed without copying, in percent, from
        its own counter; None: not tracked, or unknown (``kernel_copied_source`` says why)."""
        share = (self.engine_stats or {}).get("zero_copy_share")
        return 100.0 * share if isinstance(share, int | float) else None

    def zero_copy_reason(self) -> str | None:
        """Why a tracked row's zero-copy share is unknown (the kernel has no counter ...)."""
        if not self.tracks_copies() or self.zero_copy_share() is not None:
            return None
        source = (self.engine_stats or {}).get("kernel_copied_source")
        if not self.bytes:
            return "no bytes received"
        return str(source)

    @property
    def ok(self) -> bool:
        return self.status == "ok"
