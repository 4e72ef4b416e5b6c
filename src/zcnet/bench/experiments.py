"""Run an experiment spec: expand its matrix, substitute what the machine lacks, measure each cell
``repeat`` times, and write the envelope after every cell so an interrupted run keeps its cells.

Repeats are interleaved (all cells once, then all cells again) rather than back to back, so slow
drift of the machine (other load, thermal state) spreads over every cell instead of biasing one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from zcnet.bench import busy, meta
from zcnet.bench.client import ClientOptions, run
from zcnet.bench.control import ServerRefused
from zcnet.bench.matrix import NIC_ENGINES, BenchOptions
from zcnet.bench.proto import OptionValue
from zcnet.bench.records import (
    AxisValue,
    ExperimentInfo,
    ReportSection,
    ResultFile,
    ResultRow,
    Substitution,
)
from zcnet.bench.remote import LocalServer
from zcnet.bench.run import flow_cell, pick_cpus, run_bench
from zcnet.bench.spec import Spec
from zcnet.bench.txbench import run_txbench
from zcnet.errors import Unsupported, ZcnetError
from zcnet.jsonvalue import JSONValue
from zcnet.nic.device import Device
from zcnet.nic.ethtool import privflags_get, privflags_set
from zcnet.nic.info import ipv4_of, nic_env
from zcnet.rx.registry import engine_names
from zcnet.rx.zc.devnote import device_note
from zcnet.rx.zc.zcrx import kernel_offers

log = logging.getLogger(__name__)


def _zcrx_copy() -> bool:
    return kernel_offers().copy_mode


# Kernel features a substitution's ``unless`` may name, probed when a plan asks.
KERNEL_OFFERS: dict[str, Callable[[], bool]] = {"zcrx_copy": _zcrx_copy}


@dataclass(frozen=True)
class ExperimentRig:
    """The rig an experiment runs on: the lab (nothing given), or a real NIC on this host
    and the peer host's server or UDP sink, with the token, queue and port that reach it."""

    ifname: str | None = None
    remote: str | None = None       # bench: the sending host's `zcnet server`; txbench: UDP sink
    token: bytes | None = None      # the remote server's shared secret
    queue: int | None = None        # zcrx/devmem: the queue the flow is steered to
    data_port: int | None = None    # the receiving port a NIC flow rule steers to that queue

    def has(self, option: str) -> bool:
        """An option given (ifname, remote, ...) or a kernel feature (zcrx_copy)."""
        if option in KERNEL_OFFERS:
            return KERNEL_OFFERS[option]()
        return bool(getattr(self, option))


Cell = dict[str, AxisValue]  # one point of the matrix: axis -> value (and "peer" for a C tool)


@dataclass
class Plan:
    cells: list[Cell]
    substitutions: list[Substitution] = field(default_factory=list)
    baseline: dict[str, AxisValue] = field(default_factory=dict)


def _substitution(axis: str, value: AxisValue, lab: AxisValue, why: str,
                  shown: str | None = None) -> Substitution:
    return Substitution(axis=axis, value=value, lab=lab, why=why,
                        text=f"{shown or axis} {value} runs as {lab}: {why}")


def plan(spec: Spec, rig: ExperimentRig) -> Plan:
    """The cells to measure on this rig, and which rows were substituted and why."""
    matrix = {axis: list(vals) for axis, vals in spec.matrix.items()}
    subs: list[Substitution] = []
    for s in spec.substitutes:
        if any(rig.has(u) for u in s.unless) or s.value not in matrix[s.axis]:
            continue
        vals = matrix[s.axis]
        vals[vals.index(s.value)] = s.lab
        matrix[s.axis] = list(dict.fromkeys(vals))
        subs.append(_substitution(s.axis, s.value, s.lab, s.why))
    baseline = dict(spec.baseline)
    if spec.private_flag:
        if rig.ifname:
            # The seed's own A/B: the driver flag off (baseline) then on, every mode under both.
            variants: list[AxisValue] = [f"{spec.private_flag}=off", f"{spec.private_flag}=on"]
            matrix = {"variant": variants, **matrix}
            baseline["variant"] = f"{spec.private_flag}=off"
        else:
            why = (f"the {spec.private_flag} private flag needs an mlx5 NIC (--ifname); batching"
                   " moves to user space: many packets per system call instead of per descriptor")
            sub = _substitution("nic", spec.private_flag, "user-space batching", why, "A/B")
            subs.append(replace(sub, text=f"A/B {spec.private_flag} runs as the user-space "
                                          f"modes: {why}"))
    axes = list(matrix)
    cells: list[Cell] = [dict(zip(axes, combo, strict=True))
                         for combo in itertools.product(*(matrix[a] for a in axes))]
    if spec.tool == "bench":
        # A peer runs once per MTU and placement, in the same lab and duration as the engines.
        spots = dict.fromkeys((c.get("mtu"), c.get("placement")) for c in cells)
        cells += [_peer_cell(p, m, pl) for (m, pl) in spots for p in spec.peers]
    return Plan(cells, subs, baseline)


def _peer_cell(peer: str, mtu: AxisValue | None, placement: AxisValue | None) -> Cell:
    cell: Cell = {"engine": peer, "peer": peer}
    if mtu is not None:
        cell["mtu"] = mtu
    if placement is not None:
        cell["placement"] = placement
    return cell


@dataclass
class Measured:
    """One cell measured once: its rows, and what the measuring learnt of the system (the
    NIC's env, lab or not, the remote host), kept in the document's ``env`` where it has none."""

    rows: list[ResultRow]
    nic: JSONValue = None
    lab: bool | None = None
    remote: str | None = None


# A measurer runs one cell once.
Measure = Callable[[Spec, Cell, ExperimentRig], Measured]
Progress = Callable[[int, int, Cell], None]


def _str(cell: Cell, axis: str, default: str) -> str:
    return str(cell.get(axis, default))


def _measure_bench(spec: Spec, cell: Cell, rig: ExperimentRig) -> Measured:
    if rig.ifname:
        return _measure_bench_nic(spec, cell, rig)
    engine = _str(cell, "engine", "")
    if "peer" not in cell and engine not in engine_names():
        raise Unsupported(f"engine {engine} is not in this build",
                          f"engines here: {', '.join(engine_names())}")
    engine_opts: dict[str, OptionValue] = {}
    if "consumer" in cell:
        engine_opts["consumer"] = cell["consumer"]
        if cell["consumer"] == "thread":
            # zcrx-refs measures the release crossing CPUs: pin the consumer away from the ring.
            cpus = pick_cpus(_str(cell, "placement", "split"))
            if not isinstance(cpus, str):
                others = sorted(os.sched_getaffinity(0) - {cpus[1]})
                engine_opts["consumer_cpu"] = others[0] if others else cpus[1]
    mtu = cell.get("mtu", 1500)
    assert isinstance(mtu, int)  # the spec checked its axis values
    opts = BenchOptions(mtus=(mtu,), engines=() if "peer" in cell else (engine,),
                        peers=(_str(cell, "peer", ""),) if "peer" in cell else (),
                        placements=(_str(cell, "placement", "split"),),
                        duration=spec.duration, tx=_str(cell, "tx", "copy"),
                        engine_opts=engine_opts)
    bench_doc = run_bench(opts)
    return Measured(_bench_rows(cell, list(bench_doc.results)), nic=bench_doc.env.nic,
                    lab=bench_doc.env.lab)


def _bench_rows(cell: Cell, rows: list[ResultRow]) -> list[ResultRow]:
    """Bench cells shaped for the experiment's tables, from the lab or between two hosts."""
    for row in rows:
        if "tx" not in cell and row.tx is not None:
            # Not an axis here: keep it as a note so it does not split the cell's key from the
            # key of a cell that failed before bench could say which send path it used.
            row.tx_path, row.tx = row.tx, None
        if "consumer" not in cell and row.consumer is not None:
            row.consumer_used, row.consumer = row.consumer, None  # likewise
        # mpstat-style shares of the CPUs the cell used, over the measured interval only.
        cpus = {str(cpu): shares for side in ("tx", "rx")
                if (shares := row.side_shares(side)) is not None
                and (cpu := row.shares_cpu(side)) is not None}
        if cpus and row.cpus is None:
            row.cpus = dict(sorted(cpus.items(), key=lambda kv: int(kv[0])))
    return rows


def _measure_bench_nic(spec: Spec, cell: Cell, rig: ExperimentRig) -> Measured:
    """One cell between this host (receiving, on ``rig.ifname``) and the sending host's
    ``zcnet server`` (``rig.remote``): the real experiment, through the client."""
    ifname = rig.ifname
    assert ifname is not None
    if "peer" in cell:
        raise Unsupported("the C peers run in the lab only",
                          f"run {cell['peer']} between the two hosts by hand to compare")
    if not rig.remote:
        raise Unsupported(f"a bench on {ifname} needs the sending host",
                          "start `zcnet server --listen 0.0.0.0:18323 --token-file F` there and "
                          "pass --remote HOST --token-file F")
    mtu = int(Path(f"/sys/class/net/{ifname}/mtu").read_text())
    if cell.get("mtu", mtu) != mtu:
        raise Unsupported(f"{ifname} has MTU {mtu}, this row needs {cell['mtu']}",
                          f"set it on both hosts (ip link set dev IF mtu {cell['mtu']}) and run "
                          "again")
    engine, placement = _str(cell, "engine", ""), _str(cell, "placement", "split")
    engine_opts: dict[str, OptionValue] = {}
    if "consumer" in cell:
        engine_opts["consumer"] = cell["consumer"]
    if engine in NIC_ENGINES and rig.queue is not None:
        engine_opts.update(ifname=ifname, queue=rig.queue)
    local_ip = ipv4_of(ifname)
    if local_ip is None:
        raise ZcnetError(f"{ifname} has no IPv4 address",
                         f"give {ifname} an address the remote host can reach")
    with LocalServer(local_ip) as local:
        assert local.address is not None
        opts = ClientOptions(src=rig.remote, dst=local.address, data_port=rig.data_port,
                             rx_engine=engine, engine_opts=engine_opts, duration=spec.duration,
                             tx=_str(cell, "tx", "copy"), pin_off=0 if placement == "same" else 1,
                             tokens={local_ip: local.token}, token=rig.token)
        try:
            r = run(opts)
        except ServerRefused as e:
            if e.code == "unsupported":
                raise Unsupported(e.cause) from None
            raise
    row = flow_cell(r, mtu, engine, placement, tx=_str(cell, "tx", "copy"),
                    consumer=_str(cell, "consumer", "same"), sender_here=False)
    if engine in NIC_ENGINES and (note := device_note(ifname)):
        row.note = note  # netdevsim: simulated DMA, or (upstream) the kernel's copies
    return Measured(_bench_rows(cell, [row]), nic=nic_env(ifname), lab=False, remote=rig.remote)


def _measure_txbench(spec: Spec, cell: Cell, rig: ExperimentRig) -> Measured:
    size, burst = cell.get("payload", 64), cell.get("burst", 32)
    assert isinstance(size, int) and isinstance(burst, int)  # the spec checked its axes
    if rig.ifname and not rig.remote:
        # Toggling the NIC's flag while the packets go through the lab's veth measures nothing.
        raise Unsupported(f"the A/B on {rig.ifname} needs traffic through it",
                          "give --remote ADDR:PORT, a UDP port reachable through that NIC")
    variant = cell.get("variant")
    with _private_flag(rig.ifname, str(variant) if variant is not None else None):
        doc = run_txbench(modes=[_str(cell, "mode", "")], duration=spec.duration, repeat=1,
                          size=size, burst=burst, dst=rig.remote or None)
    why = doc.env.hw_counters
    if why and why != "yes":
        for row in doc.results:
            if row.instructions_per_pkt is None:
                row.instructions_per_pkt_reason = why
            if row.cycles_per_pkt is None:
                row.cycles_per_pkt_reason = why
    return Measured(list(doc.results))


@contextlib.contextmanager
def _private_flag(ifname: str | None, variant: str | None) -> Iterator[None]:
    """Set ``flag=on|off`` on the NIC for one cell and restore it at once afterwards."""
    if not ifname or not variant:
        yield
        return
    flag, _, state = variant.partition("=")
    with Device.open(ifname) as dev:
        try:
            before = privflags_get(dev)
        except ZcnetError as exc:
            raise Unsupported(f"{ifname}: cannot A/B the {flag} private flag: {exc.message}",
                              "this A/B needs an mlx5 NIC (ConnectX-5 or later)") from None
        if flag not in before:
            raise ZcnetError(f"{ifname} has no private flag {flag!r}",
                             f"this A/B needs an mlx5 NIC; flags here: {', '.join(before)}")
        privflags_set(dev, {flag: state == "on"})
        try:
            yield
        finally:
            privflags_set(dev, {flag: before[flag]})


MEASURERS: dict[str, Measure] = {"bench": _measure_bench, "txbench": _measure_txbench}


def new_document(spec: Spec, rig: ExperimentRig, the_plan: Plan, repeat: int) -> ResultFile:
    env = meta.collect_env(lab=rig.ifname is None, nic=rig.ifname, remote=rig.remote,
                           machine=busy.before())
    doc = meta.envelope("experiment", env, [])
    doc.warnings, doc.complete = [], False
    doc.experiment = ExperimentInfo(
        name=spec.name, title=spec.title, tool=spec.tool, seed=spec.seed,
        about=spec.about.strip(), source=spec.source, repeat=repeat, duration=spec.duration,
        substitutions=the_plan.substitutions)
    doc.report = ReportSection(
        table=spec.table, rows=spec.rows, columns=spec.columns, metric=spec.metric,
        extra=list(spec.extra), baseline=the_plan.baseline, per_cpu=spec.per_cpu,
        plots=list(spec.plots))
    return doc


def _save(json_path: str | Path, doc: ResultFile) -> None:
    try:
        meta.write_json(json_path, doc)
    except OSError as exc:
        raise ZcnetError(f"cannot write {json_path}: {exc.strerror or exc}",
                         "give a path in an existing, writable directory") from None


def iter_run(spec: Spec, *, rig: ExperimentRig | None = None, repeat: int | None = None,
             json_path: str | Path | None = None, measure: Measure | None = None,
             progress: Progress | None = None) -> Iterator[ResultFile]:
    """Measure the spec; yields the document after each cell (complete=True at the end)."""
    rig = rig or ExperimentRig()
    repeat = repeat or spec.repeat
    the_plan = plan(spec, rig)
    measure = measure or MEASURERS[spec.tool]
    doc = new_document(spec, rig, the_plan, repeat)
    total = repeat * len(the_plan.cells)
    done = 0
    if json_path is not None:
        _save(json_path, doc)  # an unwritable path fails now, not after the first cell's minutes
    try:
        for r in range(repeat):
            for cell in the_plan.cells:
                if progress:
                    progress(done, total, cell)
                try:
                    got = measure(spec, cell, rig)
                except ZcnetError as exc:
                    # One cell the machine cannot run must not end the experiment.
                    got = Measured([ResultRow(status="unsupported", reason=str(exc))])
                # What the measurer learnt about the system (e.g. the NIC) fills what is unknown.
                env = doc.env
                env.nic = env.nic if env.nic is not None else got.nic
                env.lab = env.lab if env.lab is not None else got.lab
                env.remote = env.remote or got.remote
                for row in got.rows:
                    for axis, value in cell.items():
                        if row.axis(axis) is None or axis == "variant":
                            row.set_axis(axis, value)
                    row.repeat = r
                doc.results.extend(got.rows)
                done += 1
                if json_path is not None:
                    _save(json_path, doc)
                yield doc
        doc.complete = True
        if progress:
            progress(done, total, {})
    finally:
        assert doc.env.machine is not None
        busy.after(doc.env.machine)
        doc.warnings = busy.warnings(doc.env.machine, doc.results)
        # Interrupted or not, the file holds every cell measured so far.
        if json_path is not None:
            _save(json_path, doc)
    yield doc


def run_experiment(spec: Spec, *, rig: ExperimentRig | None = None, repeat: int | None = None,
                   json_path: str | Path | None = None, measure: Measure | None = None,
                   progress: Progress | None = None) -> ResultFile:
    last: ResultFile | None = None
    for doc in iter_run(spec, rig=rig, repeat=repeat, json_path=json_path, measure=measure,
                        progress=progress):
        last = doc
    assert last is not None  # iter_run yields at least the finished document
    return last
