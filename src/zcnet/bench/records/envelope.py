"""The JSON envelope every command writes (``--json``), and its summaries.

``{"tool": "zcnet", "version", "format", "kind", "argv", "env", "results": [rows]}`` plus what a
kind adds: ``summary`` (bench: per cell over its repeats; txbench: per mode; client: the run),
``experiment`` and ``report`` (an experiment's spec and how to show it), ``cpus`` and
``options`` (client). ``env`` holds what makes two runs comparable.

``format`` 2 names the CPUs and TCP_INFO of a bench cell as a client flow names them
(``rx_app_cpu``, ``rx_cpu_end``, ``tcp_tx`` ...) and keeps a row's warnings in ``warnings``
only; :func:`upgrade` reads files of format 1 (zcnet before that) into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zcnet.bench.metrics import METRICS
from zcnet.bench.records.codec import meta
from zcnet.bench.records.flow import FIGURE, Latency, RoleShares
from zcnet.bench.records.rows import AxisValue, ResultRow
from zcnet.jsonvalue import JSONObject, JSONValue

FORMAT = 2
TABLES = ("grid", "ab", "mpstat")


@dataclass(kw_only=True)
class Machine:
    """How busy the machine was around a run (zcnet.bench.busy)."""

    cpus_usable: int | None = None
    load_before: list[float] | None = field(default=None, metadata=meta(null=True))
    load_after: list[float] | None = field(default=None, metadata=meta(null=True))
    other_labs: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Env:
    """What the results were measured on; ``extra`` holds what a command adds (the lab's
    interfaces, the client's servers ...), written as top-level keys of ``env``."""

    kernel: str | None = None
    cpus: int | None = None
    cpu_model: str | None = None
    arch: str | None = None
    python: str | None = None
    hot_path: str | None = None      # the ring's hot path: "c" (compiled) or "pure"
    lab: bool | None = None
    hostname: str | None = None
    time: str | None = None
    machine: Machine | None = None
    # bench: the site (the lab's own env, or loopback's note); txbench: "loopback" or ADDR:PORT
    target: JSONValue = None
    nic: JSONValue = None            # zcnet.nic.info.nic_env of the interface that received
    remote: str | None = None
    hw_counters: str | None = None   # txbench: "yes", or why the CPU's counters are n/a
    extra: JSONObject = field(default_factory=dict, metadata=meta(rest=True))

    def target_note(self) -> str | None:
        note = self.target.get("note") if isinstance(self.target, dict) else None
        return note if isinstance(note, str) else None


@dataclass(kw_only=True)
class Substitution:
    """An experiment's row that runs as something else here, and why."""

    axis: str
    value: AxisValue
    lab: AxisValue
    why: str
    text: str


@dataclass(kw_only=True)
class ExperimentInfo:
    name: str = ""
    title: str = ""
    tool: str = ""
    seed: str = ""
    about: str = ""
    source: str = ""
    repeat: int | None = field(default=None, metadata=meta(q="repeat"))
    duration: float | None = field(default=None, metadata=meta(q="duration"))
    substitutions: list[Substitution] = field(default_factory=list)


_METRIC = meta(choices=tuple(METRICS))


@dataclass(kw_only=True)
class ReportSection:
    """How an experiment's results are shown: a table shape, its rows and columns, the headline
    metric and extras, an A/B baseline, per-CPU tables, plots."""

    table: str = field(default="grid", metadata=meta(choices=TABLES))
    rows: str = ""
    columns: str = ""
    metric: str = field(default="gbps", metadata=_METRIC)
    extra: list[str] = field(default_factory=list, metadata=_METRIC)
    baseline: dict[str, AxisValue] = field(default_factory=dict)
    per_cpu: bool = False
    plots: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Spread:
    """A cell's figure over its repeats."""

    median: float
    min: float
    max: float
    stdev: float


@dataclass(kw_only=True)
class CellSummary:
    """``zcnet bench``: one (mtu, engine, placement) cell over its repeats."""

    engine: str
    mtu: int | None = None
    placement: str | None = None
    n: int
    ok: int
    gbps: Spread | None = None
    rx_busy: Spread | None = None


@dataclass(kw_only=True)
class MeanSd:
    mean: float | None = field(default=None, metadata=meta(null=True))
    stdev: float | None = field(default=None, metadata=meta(null=True))


@dataclass(kw_only=True)
class ModeSummary:
    """txbench: one send mode over its repeats; a mode that never ran has its status and
    reason only."""

    status: str
    reason: str | None = None
    mpps: MeanSd | None = None
    ns_per_pkt: MeanSd | None = None
    instructions_per_pkt: MeanSd | None = None
    cycles_per_pkt: MeanSd | None = None
    sent: int | None = None
    received: int | None = None
    drops: int | None = None
    bad_payload: int | None = None
    wrong_size: int | None = None
    fallback_packets: int | None = None
    retries: int | None = None
    notes: list[str] | None = None
    vs_single: float | None = field(default=None, metadata=meta(null=True))

    def metric(self, name: str) -> MeanSd | None:
        table = {"mpps": self.mpps, "ns_per_pkt": self.ns_per_pkt,
                 "instructions_per_pkt": self.instructions_per_pkt,
                 "cycles_per_pkt": self.cycles_per_pkt}
        return table[name]


@dataclass(kw_only=True)
class ClientSummary:
    """``zcnet client``: the run's flows, how many ended ok, and their total rate."""

    flows: int
    ok: int
    mode: str
    gbps: float | None = field(default=None, metadata=FIGURE)
    tps: float | None = field(default=None, metadata=FIGURE)
    latency: Latency | None = field(default=None, metadata=meta(flat=True))
    samples: int | None = None


Summary = list[CellSummary] | dict[str, ModeSummary] | ClientSummary


@dataclass(kw_only=True)
class ResultFile:
    tool: str = "zcnet"
    version: str = ""
    format: int = FORMAT
    kind: str = field(default="bench")
    argv: list[str] = field(default_factory=list)
    complete: bool | None = None
    warnings: list[str] | None = None
    reason: str | None = None         # why a run has no results (client interrupted)
    env: Env = field(default_factory=Env)
    experiment: ExperimentInfo | None = None
    report: ReportSection | None = None
    summary: Summary | None = None
    not_measured: dict[str, str] | None = None    # txbench: send paths it cannot measure
    options: JSONObject | None = None  # client: the options of the run
    cpus: dict[str, dict[str, RoleShares]] | None = None  # client: side -> CPU -> shares
    results: list[ResultRow] = field(default_factory=list)

    def rows(self, *, peers: bool = False) -> list[ResultRow]:
        """The rows of zcnet's own cells, or (``peers``) those of the C peers."""
        return [r for r in self.results if bool(r.peer) == peers]


@dataclass(kw_only=True)
class Stats:
    """One side of a comparison: a cell's metric over its repeats (zcnet.report.stats)."""

    n: int
    mean: float
    stdev: float
    min: float
    max: float
    unstable: bool


@dataclass(kw_only=True)
class ComparisonRow:
    """``zcnet compare``: one cell of A against B, and the verdict."""

    cell: dict[str, AxisValue]
    cell_text: str
    metric: str
    a: Stats | None = field(default=None, metadata=meta(null=True))
    b: Stats | None = field(default=None, metadata=meta(null=True))
    ratio: float | None = field(default=None, metadata=meta(null=True))
    pvalue: float | None = field(default=None, metadata=meta(null=True))
    verdict: str


@dataclass(kw_only=True)
class ComparisonEnv:
    a: Env
    b: Env
    differences: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class ComparisonFile:
    tool: str = "zcnet"
    version: str = ""
    format: int = FORMAT
    kind: str = "compare"
    argv: list[str] = field(default_factory=list)
    complete: bool | None = None
    files: list[str] = field(default_factory=list)
    env: ComparisonEnv
    results: list[ComparisonRow] = field(default_factory=list)


@dataclass(kw_only=True)
class NicFile:
    """``zcnet nic show|doctor --json``: the NIC's state (ethtool and netdev sections as the
    kernel answered), or the doctor's checks and whether the queues are ready."""

    tool: str = "zcnet"
    version: str = ""
    format: int = FORMAT
    kind: str
    argv: list[str] = field(default_factory=list)
    env: Env = field(default_factory=Env)
    ready: bool | None = None
    queue: int | None = None     # the first of ``queues`` (one-queue readers)
    queues: list[int] | None = None
    mode: str | None = None
    results: list[JSONObject] = field(default_factory=list)


# ---- files of format 1 -------------------------------------------------------------------------

# Bench/experiment/peer rows of format 1 named the application CPUs rx_cpu/tx_cpu and the end's
# SO_INCOMING_CPU incoming_cpu, and nested TCP_INFO as tcp.tx/tcp.rx; client rows said error.
_V1_FLOW_CELL = {"rx_cpu": "rx_app_cpu", "tx_cpu": "tx_app_cpu", "incoming_cpu": "rx_cpu_end"}


def upgrade(doc: JSONObject) -> JSONObject:
    """A format 1 document's rows renamed as format 2 names them (a copy)."""
    fmt = doc.get("format", 1)
    results = doc.get("results")
    if not (isinstance(fmt, int) and fmt < 2 and isinstance(results, list)):
        return doc
    client = doc.get("kind") == "client"
    return {**doc, "format": FORMAT,
            "results": [_upgrade_row(r, client) if isinstance(r, dict) else r for r in results]}


def _upgrade_row(row: JSONObject, client: bool) -> JSONObject:
    out = dict(row)
    if client:
        if "error" in out:
            error = out.pop("error")
            out.setdefault("reason", error if error is not None else "")
        return out
    for old, new in _V1_FLOW_CELL.items():
        if old in out:
            out[new] = out.pop(old)
    tcp = out.pop("tcp", None)
    if isinstance(tcp, dict):
        for side in ("tx", "rx"):
            if tcp.get(side) is not None:
                out[f"tcp_{side}"] = tcp[side]
    warning = out.pop("warning", None)
    if "warnings" not in out and isinstance(warning, str) and warning:
        out["warnings"] = [warning]
    return out
