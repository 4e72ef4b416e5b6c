"""The metrics a result row may carry (bench, txbench and experiment rows alike): their names,
units and which way is better. Experiment specs name them; reports format them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    higher_is_better: bool
    digits: int = 2
    short: str = ""  # how an extra reads after its value in a table cell: "95% CPU"


# Metrics a report knows how to show; rows may carry any subset.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("gbps", "throughput", "Gbit/s", True),
    Metric("mbps", "throughput", "MB/s", True, 0),
    Metric("mpps", "packet rate", "Mpps", True),
    Metric("ns_per_pkt", "CPU per packet", "ns", False, 1, "/pkt"),
    Metric("instructions_per_pkt", "instructions per packet", "", False, 0, "insn/pkt"),
    Metric("cycles_per_pkt", "cycles per packet", "", False, 0, "cycles/pkt"),
    Metric("latency_us", "latency", "us", False, 1, "latency"),
    Metric("rx_busy", "receiver CPU busy", "%", False, 0, "CPU"),
    # From the receiver's kernel copy counters (zcrx stats, devmem linear fragments).
    Metric("zero_copy_share", "zero-copy share", "%", True, 0, "zero-copy"),
)}
