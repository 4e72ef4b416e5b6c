"""What ``zcnet bench`` measures: its options (MTUs, engines, placements ...) checked, the cells
they make, and what a finished document says (peer ratios, verify failures). The runner is
``zcnet.bench.run``; this module loads none of it, so the CLI can build its parser cheaply.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from zcnet import quantities
from zcnet.bench.peers import parse_peers
from zcnet.bench.proto import OptionValue
from zcnet.bench.records import CellSummary, ResultRow, Spread
from zcnet.errors import UsageError
from zcnet.lab.topology import MTU_MAX
from zcnet.netns import can_create_netns
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import ENGINES, default_engines, engine_names
from zcnet.tx.senders import KINDS

DEFAULT_MTUS = (1500, 4096, 9000)
DEFAULT_ENGINES = default_engines()
PLACEMENTS = ("same", "split")
NIC_ENGINES = tuple(name for name, info in ENGINES.items() if info.needs_nic)


@dataclass
class BenchOptions:
    mtus: tuple[int, ...] | None = None  # None: 1500,4096,9000 in the lab, lo's MTU otherwise
    engines: tuple[str, ...] = DEFAULT_ENGINES
    placements: tuple[str, ...] = PLACEMENTS
    duration: float = 2.0
    verify: bool = False
    lab: bool | None = None          # None: lab when root, else loopback
    json_path: str | None = None
    engine_opts: dict[str, OptionValue] = field(default_factory=dict)  # EngineOptions' names
    peers: tuple[str, ...] = ()      # C tools run in the same lab/placement: iperf3, sockperf
    tx: str = "copy"                 # sender's send path (zcnet.tx.senders kinds)
    # iperf3's write size (-l); None: its default (128 KiB), zcnet's own flows write 1 MiB
    peer_write_size: int | None = None
    lab_device: str = "veth"         # the lab's link: veth, or netdevsim (zcnet's test kernel)
    # A veth lab receives on the sender's CPU (RPS; zcnet.lab.topology says why); False: as
    # veth does by itself, where one flow is received on two CPUs and reordered.
    rx_steer: bool = True
    # Times every cell runs; each repeat runs every cell once, so drift on a shared machine hits
    # every cell alike. Rows carry ``repeat``; the document's ``summary`` has medians and spread.
    repeat: int = 1

    def validate(self) -> None:
        names = engine_names()
        if self.peers:
            parse_peers(",".join(self.peers))
        if self.tx not in KINDS:
            raise UsageError(f"unknown send path {self.tx!r}", f"choose from {', '.join(KINDS)}")
        for what, values in (("engine", self.engines), ("placement", self.placements),
                             ("peer", self.peers), ("MTU", self.mtus or ())):
            if len(set(values)) != len(values):
                raise UsageError(f"an {what} repeats in {','.join(map(str, values))}",
                                 f"give each {what} once")
        if not (self.engines or self.peers) or not self.placements or self.mtus == ():
            raise UsageError("nothing to measure: an engine, placement or MTU list is empty",
                             "give at least one of each (or leave the option out)")
        for e in self.engines:
            if e not in names:
                raise UsageError(f"unknown engine {e!r}", f"choose from {', '.join(names)}")
        for p in self.placements:
            if p not in PLACEMENTS:
                raise UsageError(f"unknown placement {p!r}", f"choose from {', '.join(PLACEMENTS)}")
        for m in self.mtus or ():
            quantities.check("mtu", m, "MTU")
            if self.lab and m > MTU_MAX:
                raise UsageError(f"MTU {m} is beyond veth's largest, {MTU_MAX}",
                                 f"use {MTU_MAX} or less in the lab")
        quantities.check("duration", self.duration, "duration")
        quantities.check("repeat", self.repeat, "repeat")
        EngineOptions.from_mapping(self.engine_opts)  # names and types, before the lab is built

    def resolved(self) -> BenchOptions:
        """A copy with the lab decided (capabilities) and default MTUs filled in for it."""
        if self.lab is None:
            return replace(self, lab=can_create_netns()).resolved()
        if self.mtus is None:
            return replace(self, mtus=DEFAULT_MTUS if self.lab else (lo_mtu(),))
        return self

    def cells(self) -> list[tuple[int, str, str]]:
        """(mtu, engine-or-peer, placement) in run order: MTU outermost (few MTU changes)."""
        return [(m, e, p) for m in self.resolved().mtus or () for p in self.placements
                for e in (*self.engines, *self.peers)]


def lo_mtu() -> int:
    try:
        return int(Path("/sys/class/net/lo/mtu").read_text())
    except (OSError, ValueError):
        return 65536


CellId = tuple[int | None, str, str]  # (mtu, engine, placement) of a bench cell


def cell_groups(results: list[ResultRow]) -> dict[CellId, list[ResultRow]]:
    """The rows of each (mtu, engine, placement) cell, all its repeats, in first-seen order."""
    out: dict[CellId, list[ResultRow]] = {}
    for r in results:
        out.setdefault((r.mtu, r.engine or "", r.placement or ""), []).append(r)
    return out


def _spread(values: list[float]) -> Spread | None:
    if not values:
        return None
    return Spread(median=statistics.median(values), min=min(values), max=max(values),
                  stdev=statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize_cells(results: list[ResultRow]) -> list[CellSummary]:
    """Per cell over its repeats: how many ran (``n``) and were ok, and the median, min, max and
    sample stdev (0 for one) of its Gbit/s and of the receiving CPU's busy %."""
    out = []
    for (mtu, engine, placement), rows in cell_groups(results).items():
        ok = [r for r in rows if r.ok and r.gbps is not None]
        busy = [b for r in ok if (shares := r.side_shares("rx")) is not None
                and (b := shares.busy) is not None]
        out.append(CellSummary(engine=engine, mtu=mtu, placement=placement, n=len(rows),
                               ok=len(ok), gbps=_spread([r.gbps for r in ok if r.gbps is not None]),
                               rx_busy=_spread(busy)))
    return out


@dataclass(frozen=True)
class PeerRatio:
    """The best zcnet engine of an (MTU, placement) against a C peer there."""

    mtu: int | None
    placement: str
    engine: str
    gbps: float
    peer: str
    peer_gbps: float
    ratio: float


def peer_ratios(results: list[ResultRow], peer: str = "iperf3") -> list[PeerRatio]:
    """Best zcnet engine vs ``peer`` per (MTU, placement), for the notes and the closing table;
    with repeats, medians of each cell's Gbit/s."""
    out = []
    med = {(s.mtu, s.placement or "", s.engine): s.gbps.median
           for s in summarize_cells(results) if s.gbps is not None}
    peers = {r.engine for r in results if r.peer}
    for mtu, placement in dict.fromkeys((m, p) for m, p, _ in med):
        ref = med.get((mtu, placement, peer))
        ours = {e: g for (m, p, e), g in med.items()
                if (m, p) == (mtu, placement) and e not in peers and g > 0}
        if ref and ours:
            best = max(ours, key=lambda e: ours[e])
            out.append(PeerRatio(mtu, placement, best, ours[best], peer, ref,
                                 round(ours[best] / ref, 3)))
    return out


def verify_failed(results: list[ResultRow]) -> int:
    return sum(r.verify.mismatches for r in results if r.verify is not None)
