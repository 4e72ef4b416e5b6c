"""``zcnet bench`` as a Python API: MTU x engine x placement cells, one TCP flow each.

Some facts about placement in the lab: veth's transmit hands the packet to the peer with
netif_rx on the *sending* CPU, and a flow's data is also sent from the CPU that processes its
ACKs; so a veth lab's receive side is steered (RPS, :meth:`Lab.steer_rx`) to the sender's CPU,
where the receive softirq then always runs, as on a NIC whose queue interrupt is there (without
it one flow is received on two CPUs and reordered: see zcnet.lab.topology). ``same`` therefore
pins the receiving application to the sender's CPU (the seed's "application and interrupts on
the same core"); ``split`` pins it to another CPU. On real NICs the softirq CPU is the IRQ's;
each result records SO_INCOMING_CPU so a reader can check.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from zcnet.bench import busy, intervals
from zcnet.bench.client import ClientOptions, ClientResult, LabServers, lab_servers, run
from zcnet.bench.control import ServerRefused
from zcnet.bench.matrix import (
    DEFAULT_ENGINES,
    NIC_ENGINES,
    PLACEMENTS,
    BenchOptions,
    lo_mtu,
    summarize_cells,
)
from zcnet.bench.meta import Interrupted, collect_env, envelope, write_json
from zcnet.bench.peers import run_peer
from zcnet.bench.proto import OptionValue
from zcnet.bench.records import (
    SHARE_NAMES,
    CpuPair,
    CpuShares,
    EngineStat,
    Intervals,
    ResultFile,
    ResultRow,
)
from zcnet.bench.remote import LocalServer
from zcnet.errors import UsageError, ZcnetError
from zcnet.jsonvalue import JSONObject
from zcnet.lab import Lab, netdevsim
from zcnet.lab.sweep import before_run
from zcnet.netns import can_create_netns
from zcnet.nic import setup
from zcnet.nic.info import nic_env
from zcnet.rx.zc.devnote import device_note

log = logging.getLogger(__name__)

# The options and their defaults live in zcnet.bench.matrix (the CLI reads them without loading
# the runner); they are part of this API too.
__all__ = ["DEFAULT_ENGINES", "PLACEMENTS", "BenchOptions", "BenchSite", "bench_site",
           "flow_cell", "pick_cpus", "run_bench", "run_one", "zcrx_mode"]


@dataclass
class BenchSite:
    """The site a bench flow runs on: the zcnet servers at its two ends (client.LabServers, in
    the lab's two namespaces or both on loopback: the code path of a run between two hosts), how
    to change the MTU there (None on loopback), its env for the JSON, and the lab if any."""

    servers: LabServers
    set_mtu: Callable[[int], None] | None
    env: JSONObject
    lab: Lab | None = None  # for peers that run inside it
    data_port: int | None = None  # the receiving port a flow rule steers (None: any port)


# The receiving port of flows in a netdevsim lab: nic setup's flow rule steers it to --queue.
NETDEVSIM_DATA_PORT = 9000


def softirq_cpu() -> int:
    """The sender's CPU in every placement, where a veth lab's receive softirq is steered."""
    return min(os.sched_getaffinity(0))


def pick_cpus(placement: str) -> tuple[int, int] | str:
    """(tx_cpu, rx_cpu) for a placement, or the reason it cannot run here."""
    cpus = sorted(os.sched_getaffinity(0))
    tx = softirq_cpu()
    if placement == "same":
        return tx, tx
    if len(cpus) < 2:
        return "split placement needs two CPUs; this process may use one"
    return tx, cpus[1]


@contextlib.contextmanager
def bench_site(use_lab: bool, mtu: int, device: str = "veth",
               queue: int | None = None, rx_steer: bool = True) -> Iterator[BenchSite]:
    if use_lab:
        before_run()  # stale labs go; others are announced (log warnings)
        with Lab(mtu=mtu, device=device) as lab, contextlib.ExitStack() as stack:
            data_port = None
            if device == "netdevsim" and queue is not None:
                data_port = _netdevsim_queue(stack, lab, queue)
            if device == "veth" and rx_steer:
                steer(lab)
            servers = stack.enter_context(lab_servers(lab))
            yield BenchSite(servers, lab.set_mtu, lab.env(), lab, data_port)
    else:
        with LocalServer("127.0.0.1") as srv:  # one server holds both ends of the flow
            assert srv.address is not None
            yield BenchSite(LabServers(srv.address, srv.address, {"127.0.0.1": srv.token}, None),
                         None, {"lab": False, "mtu": lo_mtu(),
                                "note": "loopback (127.0.0.1), not a lab"})


def _to_the_lab() -> str:
    """How to get the lab instead of loopback: only a process without the capabilities needs
    root; one that has them was told --no-lab."""
    if can_create_netns():
        return "leave out --no-lab to use the lab"
    return "run as root to use the lab"


def _netdevsim_queue(stack: contextlib.ExitStack, lab: Lab, queue: int) -> int | None:
    """Prepare the receiving netdevsim port for zcrx/devmem on ``queue`` as a NIC is prepared
    (`nic setup`, restored at exit); returns the data port the flows must use, or None.

    zcnet's netdevsim (ntuple, RSS) gets the whole plan: RSS off the queue and a flow rule for
    NETDEVSIM_DATA_PORT, so only the data flow lands there: a control connection on a queue
    holding a provider would find its bytes unreadable. Upstream netdevsim (no ntuple, and no
    DMA into provider memory) gets channels and HDS, and the sending port transmits on the
    queue (XPS): it receives on the queue numbered like the sender's TX queue."""
    cfg = setup.NicConfig(lab.if_b, queue, NETDEVSIM_DATA_PORT, netns=lab.ns_b)
    steps = stack.enter_context(setup.applied(cfg))
    if any(s.kind == "flow-rule" for s in steps):
        return NETDEVSIM_DATA_PORT
    netdevsim.steer_tx(lab.ns_a, lab.if_a, queue)
    return None


def _nic_env(t: BenchSite) -> JSONObject:
    """Driver, rings, HDS and offloads of the receiving interface, for the JSON env."""
    if t.lab is not None:
        return nic_env(t.lab.if_b, t.lab.ns_b)
    return nic_env("lo")


def run_one(t: BenchSite, mtu: int, engine: str, placement: str,
            opts: BenchOptions) -> ResultRow:
    peer = engine in opts.peers
    # A cell that does not run still names its send path and consumer, as the cells that ran
    # do: its repeats and the other runs' cells share its key (zcnet.report.cells).
    cell = ResultRow(engine=engine, mtu=mtu, placement=placement, status="unsupported",
                     tx=None if peer else opts.tx,
                     consumer=None if peer else _consumer(opts.engine_opts))
    cpus = pick_cpus(placement)
    if isinstance(cpus, str):
        cell.reason = cpus
        return cell
    if t.set_mtu is None and mtu != t.env["mtu"]:
        cell.reason = (f"loopback cannot set MTU {mtu} (lo has {t.env['mtu']}); "
                       f"{_to_the_lab()}")
        return cell
    tx_cpu, rx_cpu = cpus
    if peer:
        return run_peer_cell(t, mtu, engine, placement, opts, rx_cpu, tx_cpu)
    engine_opts = dict(opts.engine_opts)
    if engine in NIC_ENGINES and engine_opts.get("ifname") is None and t.lab is not None:
        # Register on the lab's receiving port (queue 0 unless --queue): on veth the cell shows
        # the kernel's own answer (EOPNOTSUPP), tested up to the device boundary; on netdevsim
        # the registration succeeds and the cell's note says whose copy or DMA filled it.
        engine_opts.update(ifname=t.lab.if_b, queue=engine_opts.get("queue") or 0)
    res = run_via_servers(t, cell, opts, engine_opts, rx_cpu, tx_cpu)
    if engine in NIC_ENGINES and "netdevsim" in t.env and t.lab is not None:
        res.note = device_note(t.lab.if_b, t.lab.ns_b)
    return res


def _consumer(engine_opts: dict[str, OptionValue]) -> str:
    return str(engine_opts.get("consumer", "same"))


def run_via_servers(t: BenchSite, cell: ResultRow, opts: BenchOptions,
                    engine_opts: dict[str, OptionValue], rx_cpu: int, tx_cpu: int) -> ResultRow:
    """One cell through the servers: the client opens, connects, pins and starts the flow."""
    assert cell.engine is not None and cell.mtu is not None and cell.placement is not None
    copts = t.servers.options(ClientOptions(
        rx_engine=cell.engine, engine_opts=engine_opts, tx=opts.tx, verify=opts.verify,
        duration=opts.duration, rx_app_cpu=rx_cpu, tx_app_cpu=tx_cpu, data_port=t.data_port))
    try:
        r = run(copts)
    except ServerRefused as e:
        cell.status, cell.reason = ("unsupported", e.cause) if e.code == "unsupported" \
            else ("error", e.reason)
        return cell
    except ZcnetError as e:
        cell.status, cell.reason = "error", e.message
        return cell
    return flow_cell(r, cell.mtu, cell.engine, cell.placement, tx=opts.tx,
                     consumer=_consumer(engine_opts))


def flow_cell(r: ClientResult, mtu: int, engine: str, placement: str, *, tx: str,
              consumer: str, sender_here: bool = True) -> ResultRow:
    """A bench cell from a one-flow ``client.run`` result (in the lab or between two hosts):
    the flow's own fields under their own names, and the cell's.

    CPU shares are those of the receiving application's CPU on the receiving host and of the
    sender's CPU on the sending host (each side's own /proc/stat). ``sender_here``: the sender
    runs on the receiving machine too (lab, loopback), so its task is the flow's own.
    """
    f = r.flows[0]
    cell = ResultRow(engine=engine, mtu=mtu, placement=placement, tx=tx, consumer=consumer,
                     via="server", rx_cpu=f.rx_cpu, tx_cpu=f.tx_cpu, rx_app_cpu=f.rx_app_cpu,
                     tx_app_cpu=f.tx_app_cpu, rx_cpu_end=f.rx_cpu_end, tx_cpu_end=f.tx_cpu_end)
    if not f.ok:
        cell.status, cell.reason = "error", f.reason or "flow failed"
        return cell
    cell.bytes, cell.seconds, cell.gbps, cell.syscalls = f.bytes, f.seconds, f.gbps, f.syscalls
    cell.engine_stats, cell.tx_stats, cell.verify = f.engine_stats, f.tx_stats, f.verify
    cell.tcp_tx, cell.tcp_rx = f.tcp_tx, f.tcp_rx
    rx_cpu, tx_cpu = cell.shares_cpu("rx"), cell.shares_cpu("tx")
    cell.cpu = CpuPair(rx=_sampled(r.side_cpus("dst").get(str(rx_cpu))),
                       tx=_sampled(r.side_cpus("src").get(str(tx_cpu))))
    missing = [f"{role} CPU {where}" for role, where, shares in
               (("rx", rx_cpu, cell.cpu.rx), ("tx", tx_cpu, cell.cpu.tx)) if shares is None]
    if missing:
        cell.cpu_reason = ("no /proc/stat share recorded for the " + " and ".join(missing)
                           + ": shown as n/a")
    cell.zcrx_mode = zcrx_mode(f.engine_stats or {})
    cell.warnings = _placement_warnings(placement, f.rx_cpu_end, rx_cpu)
    cell.warnings += _spread(cell, f.intervals, own=2 if sender_here else 1)
    return cell


def _placement_warnings(placement: str, incoming: int | None, rx_cpu: int | None) -> list[str]:
    if placement == "same" and incoming not in (None, -1, rx_cpu):
        return [f"receive softirq ran on CPU {incoming}, not the application's CPU {rx_cpu}"]
    if placement == "split" and incoming is not None and incoming == rx_cpu:
        return [f"receive softirq ran on the application's CPU {rx_cpu}: this cell measured "
                "same-CPU placement, not split"]
    return []


def _spread(cell: ResultRow, samples: Intervals | None, own: int) -> list[str]:
    """Record the flow's per-interval samples, their spread (coefficient of variation) and the
    tasks that ran besides the flow's ``own``; a warning when the rate wandered."""
    if samples is None:
        return []
    cell.intervals = samples
    cv = intervals.spread(samples)
    others = intervals.others_running(samples, own)
    cell.interval_cv = None if cv is None else round(cv, 4)
    cell.others_running = others
    if cv is None or cv <= intervals.UNSTABLE_CV:
        return []
    n = len(samples.seconds) - 2
    text = (f"{intervals.UNSTEADY}: per-interval Gbit/s varied {100 * cv:.0f}% (stdev/mean "
            f"over {n} intervals of {samples.interval:g} s, limit "
            f"{100 * intervals.UNSTABLE_CV:.0f}%)")
    if others:
        text += f", with a median of {others:g} other tasks running beside the flow"
    return [text]


def steer(lab: Lab) -> None:
    """Steer a veth lab's receive to :func:`softirq_cpu`; where the kernel cannot, say so and
    run unsteered (the results' ``rx_steer_cpu`` is then null)."""
    try:
        lab.steer_rx(softirq_cpu())
    except ZcnetError as e:
        log.warning("%s; the lab runs unsteered: one flow may be received on two CPUs and "
                    "reordered", e.message)


def _sampled(shares: CpuShares | None) -> CpuShares | None:
    """A side's CPU shares (without the roles of a client's table), or None when that CPU was
    not sampled (n/a, never 0%)."""
    if shares is None or not shares.sampled:
        return None
    return CpuShares(**{k: getattr(shares, k) for k in SHARE_NAMES})


def zcrx_mode(engine_stats: dict[str, EngineStat]) -> str | None:
    """"copy" when the kernel copied into the zcrx area (no device queue), "device" when a NIC
    queue filled it, None for other engines."""
    if "zcrx_copy" not in engine_stats:
        return None
    return "copy" if engine_stats["zcrx_copy"] else "device"


def run_peer_cell(t: BenchSite, mtu: int, peer: str, placement: str, opts: BenchOptions,
                  rx_cpu: int, tx_cpu: int) -> ResultRow:
    if t.lab is None:
        return ResultRow(engine=peer, mtu=mtu, placement=placement, status="unsupported",
                         reason=f"peers run inside the lab; {_to_the_lab()}")
    row = run_peer(peer, t.lab, rx_cpu=rx_cpu, tx_cpu=tx_cpu, duration=opts.duration, mtu=mtu,
                   placement=placement,
                   length=opts.peer_write_size if peer == "iperf3" else None)
    if row.gbps is not None:
        row.gbps = round(row.gbps, 3)
    return row


ProgressFn = Callable[[ResultRow], None]
StartFn = Callable[[int, str, str], None]  # (mtu, engine, placement) of the cell beginning


def run_bench(opts: BenchOptions, on_cell: ProgressFn | None = None,
              on_start: StartFn | None = None) -> ResultFile:
    """Run every cell ``opts.repeat`` times (each repeat runs every cell once); returns the JSON
    envelope, whose rows carry ``repeat`` and whose ``summary`` has each cell's medians and
    spread. Writes ``opts.json_path`` after each cell. ``on_start`` hears of each cell as it
    begins, ``on_cell`` gets its result row."""
    opts = opts.resolved()
    opts.validate()
    results: list[ResultRow] = []
    machine = busy.before()
    env = collect_env(lab=False, machine=machine)
    doc = envelope("bench", env, results)
    doc.warnings = []
    if not opts.mtus:
        raise UsageError("no MTU given", "pass --mtu 1500,4096,9000 or leave it out")
    by_mtu: dict[int, list[tuple[str, str]]] = {}
    for mtu, engine, placement in opts.cells():
        by_mtu.setdefault(mtu, []).append((engine, placement))
    assert opts.mtus is not None
    first = opts.mtus[0]
    doc.complete = False
    if opts.json_path:
        write_json(opts.json_path, doc)  # a bad path fails now, not after the first cell
    try:
        with bench_site(opts.lab, first, opts.lab_device, opts.engine_opts.get("queue"),
                        opts.rx_steer) as t:
            env.lab, env.target, env.nic = t.env["lab"] is True, t.env, _nic_env(t)
            mtu_now = first
            for rep in range(opts.repeat):
                for mtu, cells in by_mtu.items():
                    if t.set_mtu is not None and mtu != mtu_now:
                        assert t.lab is not None
                        t.set_mtu(mtu)
                        t.env = t.lab.env()
                    mtu_now = mtu
                    for engine, placement in cells:
                        if on_start:
                            on_start(mtu, engine, placement)
                        res = run_one(t, mtu, engine, placement, opts)
                        res.repeat = rep
                        results.append(res)
                        doc.summary = summarize_cells(results)
                        if opts.json_path:
                            write_json(opts.json_path, doc)
                        if on_cell:
                            on_cell(res)
        doc.complete = True
    except KeyboardInterrupt:
        # Whatever was measured is kept (and written below), marked incomplete.
        raise Interrupted(doc) from None
    finally:
        busy.after(machine)
        doc.warnings = busy.warnings(machine, results)
        if opts.json_path:
            write_json(opts.json_path, doc)
    return doc
