"""What one flow measures, as its worker reports it and the server sends it to the client: the
pieces every result row is made of (CPU shares, TCP_INFO deltas, verification, the per-interval
samples, the latency summary) and the result of one flow end.

Field names here are the names in every later stage (result rows, JSON files, tables).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from zcnet.bench.records.codec import meta
from zcnet.tx.slots import SendStats

# An engine's own counters and notes (zcnet.rx: rounds, kernel_copied_bytes, why ...).
EngineStat = bool | int | float | str | None
SHARE = meta(q="share")
FIGURE = meta(q="figure")
CPU_KEYS = meta(keys=(str.isdigit, "CPU numbers"))


@dataclass(kw_only=True)
class CpuShares:
    """One CPU's time over an interval in percent, as mpstat shows it (/proc/stat): the first
    nine add up to 100; ``busy`` is 100 - idle - iowait. All None: the CPU was not sampled (no
    tick elapsed), which reads n/a, never 0 %. A file written before a share was recorded
    lacks it: None there too."""

    usr: float | None = field(default=None, metadata=SHARE)
    nice: float | None = field(default=None, metadata=SHARE)
    sys: float | None = field(default=None, metadata=SHARE)
    iowait: float | None = field(default=None, metadata=SHARE)
    irq: float | None = field(default=None, metadata=SHARE)
    soft: float | None = field(default=None, metadata=SHARE)
    steal: float | None = field(default=None, metadata=SHARE)
    guest: float | None = field(default=None, metadata=SHARE)
    idle: float | None = field(default=None, metadata=SHARE)
    busy: float | None = field(default=None, metadata=SHARE)

    @property
    def sampled(self) -> bool:
        return self.idle is not None

    def share(self, name: str) -> float | None:
        """A share by its name (``SHARES`` or ``busy``), for tables that list them."""
        if name not in SHARE_NAMES:
            raise KeyError(name)
        value: float | None = getattr(self, name)
        return value

    def busy_share(self) -> float | None:
        """``busy``, or where a file lacks it, 100 - idle - iowait."""
        if self.busy is not None:
            return self.busy
        if self.idle is not None:
            return 100.0 - self.idle - (self.iowait or 0.0)
        return None


SHARE_NAMES = tuple(f.name for f in fields(CpuShares))


@dataclass(kw_only=True)
class RoleShares(CpuShares):
    """A CPU's shares on one side of a client run, and what ran there (``rx-softirq``,
    ``tx-app`` ...)."""

    roles: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class CpuPair:
    """The shares of the receiving application's CPU and of the sender's (each on its own
    host); None for a side that was not sampled."""

    rx: CpuShares | None = field(default=None, metadata=meta(null=True))
    tx: CpuShares | None = field(default=None, metadata=meta(null=True))


@dataclass(kw_only=True)
class TcpDelta:
    """TCP_INFO over a flow (``zcnet.bench.tcpinfo``): counters as the difference between start
    and end, gauges at the end. None: the kernel did not report it."""

    retrans: int | None = None
    bytes_retrans: int | None = None
    reord_seen: int | None = None
    dsack_dups: int | None = None
    rcv_ooopack: int | None = None
    segs_out: int | None = None
    segs_in: int | None = None
    bytes_acked: int | None = None
    bytes_received: int | None = None
    bytes_sent: int | None = None
    rwnd_limited_us: int | None = None
    sndbuf_limited_us: int | None = None
    busy_time_us: int | None = None
    rtt_us: int | None = None
    rttvar_us: int | None = None
    min_rtt_us: int | None = None
    snd_cwnd: int | None = None
    reordering: int | None = None
    snd_mss: int | None = None
    rcv_mss: int | None = None
    pmtu: int | None = None


@dataclass(kw_only=True)
class Verify:
    """The receiver's check of every byte against the sender's pattern."""

    checked_bytes: int = field(metadata=FIGURE)
    mismatches: int = field(metadata=FIGURE)


@dataclass(kw_only=True)
class Intervals:
    """A stream receiver's samples every ``interval`` seconds (zcnet.bench.intervals): each
    interval's length, the bytes it received, and the tasks running on the machine."""

    interval: float = field(metadata=FIGURE)
    seconds: list[float] = field(default_factory=list, metadata=FIGURE)
    bytes: list[int] = field(default_factory=list, metadata=FIGURE)
    running: list[int] = field(default_factory=list, metadata=FIGURE)


@dataclass(kw_only=True)
class Latency:
    """Request/response round trips from an HDR histogram, in microseconds."""

    p50_us: float | None = field(default=None, metadata=FIGURE)
    p90_us: float | None = field(default=None, metadata=FIGURE)
    p99_us: float | None = field(default=None, metadata=FIGURE)
    p99_9_us: float | None = field(default=None, metadata=meta(q="figure", json="p99.9_us"))
    mean_us: float | None = field(default=None, metadata=FIGURE)
    max_us: float | None = field(default=None, metadata=FIGURE)
    min_us: float | None = field(default=None, metadata=FIGURE)

    def percentiles(self) -> list[tuple[str, float | None]]:
        """(label, value) of p50, p90, p99 and p99.9, as a table heads them."""
        return [("p50", self.p50_us), ("p90", self.p90_us), ("p99", self.p99_us),
                ("p99.9", self.p99_9_us)]


@dataclass(kw_only=True)
class FlowEnd:
    """One end of one flow (``role`` rx or tx) as its worker measured it. Stream: the receiver
    has ``bytes``, ``syscalls``, ``engine_stats``, ``intervals`` (and ``verify``), the sender
    ``bytes_sent`` and ``tx_stats``; request/response: ``transactions``, and the asking side
    ``latency`` over ``samples`` round trips. ``status`` error: ``reason`` says why, and the
    figures are absent."""

    flow: int
    role: str = field(metadata=meta(choices=("rx", "tx")))
    status: str = field(default="ok", metadata=meta(choices=("ok", "error")))
    reason: str = ""
    cpu_end: int | None = None        # SO_INCOMING_CPU when the flow ended
    tcp: TcpDelta | None = None
    seconds: float | None = field(default=None, metadata=FIGURE)
    bytes: int | None = field(default=None, metadata=FIGURE)
    bytes_sent: int | None = field(default=None, metadata=FIGURE)
    syscalls: int | None = field(default=None, metadata=FIGURE)
    engine_stats: dict[str, EngineStat] | None = None
    tx_stats: SendStats | None = None
    verify: Verify | None = None
    intervals: Intervals | None = None
    transactions: int | None = field(default=None, metadata=FIGURE)
    latency: Latency | None = None
    samples: int | None = field(default=None, metadata=FIGURE)
    hist: str | None = None           # HDR histogram, base64: merged by the session


@dataclass(kw_only=True)
class RunResults:
    """A server's answer to ``start``: every flow end it ran, the run's length, the shares of
    the CPUs the flows used (by CPU number), and its flows' latency histograms merged."""

    flows: list[FlowEnd] = field(default_factory=list)
    seconds: float = field(metadata=meta(q="figure"))
    cpus: dict[str, CpuShares] = field(default_factory=dict, metadata=CPU_KEYS)
    hist: str | None = None
