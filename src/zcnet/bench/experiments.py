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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zcnet.bench import busy, meta
from zcnet.bench.client import ClientOptions, run
from zcnet.bench.control import ServerRefused
from zcnet.bench.matrix import NIC_ENGINES, BenchOptions
from zcnet.bench.remote import LocalServer
from zcnet.bench.run import flow_cell, pick_cpus, run_bench
from zcnet.bench.spec import Spec
from zcnet.bench.txbench import run_txbench
from zcnet.errors import Unsupported, ZcnetError
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


@dataclass
class Plan:
    cells: list[dict[str, Any]]
    substitutions: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)


def _sub_text(axis: str, value: Any, lab: Any, why: str) -> str:
    return f"{axis} {value} runs as {lab}: {why}"


def plan(spec: Spec, rig: ExperimentRig) -> Plan:
    """The cells to measure on this rig, and which rows were substituted and why."""
    matrix = {axis: list(vals) for axis, vals in spec.matrix.items()}
    subs: list[dict[str, Any]] = []
    for s in spec.substitutes:
        if any(rig.has(u) for u in s.unless) or s.value not in matrix[s.axis]:
            continue
        vals = matrix[s.axis]
        vals[vals.index(s.value)] = s.lab
        matrix[s.axis] = list(dict.fromkeys(vals))
        subs.append({"axis": s.axis, "value": s.value, "lab": s.lab, "why": s.why,
                     "text": _sub_text(s.axis, s.value, s.lab, s.why)})
    baseline = dict(spec.baseline)
    if spec.private_flag:
        if rig.ifname:
            # The seed's own A/B: the driver flag off (baseline) then on, every mode under both.
            matrix = {"variant": [f"{spec.private_flag}=off", f"{spec.private_flag}=on"],
                      **matrix}
            baseline["variant"] = f"{spec.private_flag}=off"
        else:
            why = (f"the {spec.private_flag} private flag needs an mlx5 NIC (--ifname); batching"
                   " moves to user space: many packets per system call instead of per descriptor")
            subs.append({"axis": "nic", "value": spec.private_flag, "lab": "user-space batching",
                         "why": why, "text": _sub_text("A/B", spec.private_flag,
                                                       "the user-space modes", why)})
    axes = list(matrix)
    cells = [dict(zip(axes, combo, strict=True))
             for combo in itertools.product(*(matrix[a] for a in axes))]
    if spec.tool == "bench":
        # A peer runs once per MTU and placement, in the same lab and duration as the engines.
        spots = dict.fromkeys((c.get("mtu"), c.get("placement")) for c in cells)
        cells += [{"engine": p, "peer": p, "mtu": m, "placement": pl}
                  for (m, pl) in spots for p in spec.peers]
    return Plan(cells, subs, baseline)


# A measurer runs one cell once and returns its result rows (bench-cell shaped).
Measure = Callable[[Spec, dict[str, Any], ExperimentRig], list[dict[str, Any]]]
Progress = Callable[[int, int, dict[str, Any]], None]


def _measure_bench(spec: Spec, cell: dict[str, Any], rig: ExperimentRig) -> list[dict[str, Any]]:
    if rig.ifname:
        return _measure_bench_nic(spec, cell, rig)
    engine = cell["engine"]
    if "peer" not in cell and engine not in engine_names():
        raise Unsupported(f"engine {engine} is not in this build",
                          f"engines here: {', '.join(engine_names())}")
    engine_opts: dict[str, Any] = {}
    if "consumer" in cell:
        engine_opts["consumer"] = cell["consumer"]
        if cell["consumer"] == "thread":
            # zcrx-refs measures the release crossing CPUs: pin the consumer away from the ring.
            cpus = pick_cpus(cell.get("placement", "split"))
            if not isinstance(cpus, str):
                others = sorted(os.sched_getaffinity(0) - {cpus[1]})
                engine_opts["consumer_cpu"] = others[0] if others else cpus[1]
    opts = BenchOptions(mtus=(cell["mtu"],) if "mtu" in cell else (1500,),
                        engines=() if "peer" in cell else (engine,),
                        peers=(cell["peer"],) if "peer" in cell else (),
                        placements=(cell.get("placement", "split"),),
                        duration=spec.duration, tx=cell.get("tx", "copy"),
                        engine_opts=engine_opts)
    bench_doc = run_bench(opts)
    rows = list(bench_doc["results"])
    for row in rows:
        row["_env"] = {k: bench_doc["env"][k] for k in ("nic", "lab") if k in bench_doc["env"]}
    return _bench_rows(cell, rows)


def _bench_rows(cell: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bench cells shaped for the experiment's tables, from the lab or between two hosts."""
    for row in rows:
        if "tx" not in cell and "tx" in row:
            # Not an axis here: keep it as a note so it does not split the cell's key from the
            # key of a cell that failed before bench could say which send path it used.
            row["tx_path"] = row.pop("tx")
        if "consumer" not in cell and "consumer" in row:
            row["consumer_used"] = row.pop("consumer")  # likewise
        # mpstat-style shares of the CPUs the cell used, over the measured interval only.
        cpu = row.get("cpu") or {}
        cpus = {str(row[f"{side}_cpu"]): cpu[side] for side in ("tx", "rx")
                if cpu.get(side) and f"{side}_cpu" in row}
        if cpus:
            row.setdefault("cpus", dict(sorted(cpus.items(), key=lambda kv: int(kv[0]))))
    return rows


def _measure_bench_nic(spec: Spec, cell: dict[str, Any],
                       rig: ExperimentRig) -> list[dict[str, Any]]:
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
    engine, placement = cell["engine"], cell.get("placement", "split")
    engine_opts: dict[str, Any] = {}
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
                             tx=cell.get("tx", "copy"), pin_off=0 if placement == "same" else 1,
                             tokens={local_ip: local.token}, token=rig.token)
        try:
            r = run(opts)
        except ServerRefused as e:
            if e.code == "unsupported":
                raise Unsupported(e.cause) from None
            raise
    row = flow_cell(r, mtu, engine, placement, tx=cell.get("tx", "copy"),
                    consumer=cell.get("consumer", "same"), sender_here=False)
    if engine in NIC_ENGINES and (note := device_note(ifname)):
        row["note"] = note  # netdevsim: simulated DMA, or (upstream) the kernel's copies
    row["_env"] = {"nic": _nic_env(ifname), "lab": False, "remote": rig.remote}
    return _bench_rows(cell, [row])


def _nic_env(ifname: str) -> dict[str, Any]:
    return nic_env(ifname)


def _measure_txbench(spec: Spec, cell: dict[str, Any], rig: ExperimentRig) -> list[dict[str, Any]]:
    kwargs: dict[str, Any] = {"modes": [cell["mode"]], "duration": spec.duration, "repeat": 1}
    if "payload" in cell:
        kwargs["size"] = cell["payload"]
    if "burst" in cell:
        kwargs["burst"] = cell["burst"]
    if rig.ifname and not rig.remote:
        # Toggling the NIC's flag while the packets go through the lab's veth measures nothing.
        raise Unsupported(f"the A/B on {rig.ifname} needs traffic through it",
                          "give --remote ADDR:PORT, a UDP port reachable through that NIC")
    if rig.remote:
        kwargs["dst"] = rig.remote
    with _private_flag(rig.ifname, cell.get("variant")):
        doc = run_txbench(**kwargs)
    why = doc.get("env", {}).get("hw_counters")
    rows = list(doc["results"])
    for row in rows:
        for m in ("instructions_per_pkt", "cycles_per_pkt"):
            if row.get(m) is None and why and why != "yes":
                row[f"{m}_reason"] = why
    return rows


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


def new_document(spec: Spec, rig: ExperimentRig, the_plan: Plan, repeat: int) -> dict[str, Any]:
    env = meta.collect_env(lab=rig.ifname is None, nic=rig.ifname, remote=rig.remote,
                           machine=busy.before())
    return meta.envelope(
        "experiment", env, [], warnings=[],
        experiment={"name": spec.name, "title": spec.title, "tool": spec.tool, "seed": spec.seed,
                    "about": spec.about.strip(), "source": spec.source, "repeat": repeat,
                    "duration": spec.duration, "substitutions": the_plan.substitutions},
        report={"table": spec.table, "rows": spec.rows, "columns": spec.columns,
                "metric": spec.metric, "extra": list(spec.extra), "baseline": the_plan.baseline,
                "per_cpu": spec.per_cpu, "plots": list(spec.plots)},
        complete=False)


def _save(json_path: str | Path, doc: dict[str, Any]) -> None:
    try:
        meta.write_json(json_path, doc)
    except OSError as exc:
        raise ZcnetError(f"cannot write {json_path}: {exc.strerror or exc}",
                         "give a path in an existing, writable directory") from None


def iter_run(spec: Spec, *, rig: ExperimentRig | None = None, repeat: int | None = None,
             json_path: str | Path | None = None, measure: Measure | None = None,
             progress: Progress | None = None) -> Iterator[dict[str, Any]]:
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
                    rows = measure(spec, cell, rig)
                except ZcnetError as exc:
                    # One cell the machine cannot run must not end the experiment.
                    rows = [{**cell, "status": "unsupported", "reason": str(exc)}]
                for row in rows:
                    # Measurers may report what they learnt about the system (e.g. the NIC).
                    for k, v in (row.pop("_env", None) or {}).items():
                        if doc["env"].get(k) is None:
                            doc["env"][k] = v
                    row.update({k: v for k, v in cell.items() if k not in row or k == "variant"})
                    row["repeat"] = r
                doc["results"].extend(rows)
                done += 1
                if json_path is not None:
                    _save(json_path, doc)
                yield doc
        doc["complete"] = True
        if progress:
            progress(done, total, {})
    finally:
        busy.after(doc["env"]["machine"])
        doc["warnings"] = busy.warnings(doc["env"]["machine"], doc["results"])
        # Interrupted or not, the file holds every cell measured so far.
        if json_path is not None:
            _save(json_path, doc)
    yield doc


def run_experiment(spec: Spec, **kwargs: Any) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for doc in iter_run(spec, **kwargs):
        last = doc
    return last
