"""Stream Gbit/s through zcnet server + client vs the same engine run in-process.

Target (issue 6): through server/client >= 0.95x in-process. In-process: this script accepts the
connection and runs the rx engine itself, a child process sends (the same sender the server's
flow workers use). Through server/client: a ``zcnet server`` subprocess runs both ends as flow
workers, driven over the control protocol. One flow on loopback; by default the receiving
application runs on CPU 1 and the sender on CPU 0 in both (``--no-split``: nothing pinned). Rounds
alternate, swapping which goes first, so drift on this shared machine hits both; medians are
compared.

    python benchmarks/client_stream_vs_inprocess.py [--engine epoll] [--rounds 3] [--duration 3]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys

from zcnet.bench.client import ClientOptions, run
from zcnet.bench.flow_worker import FlowSpec, Start, flow_main
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import make_engine

RX_CPU, TX_CPU = 1, 0


def in_process(engine: str, duration: float, size: int, split: bool) -> float:
    ctx = mp.get_context("forkserver")
    mask = os.sched_getaffinity(0)
    with socket.create_server(("127.0.0.1", 0)) as ls:
        spec = FlowSpec(role="tx", mode="stream", host="127.0.0.1", port=ls.getsockname()[1],
                        write_size=size)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=flow_main, args=(spec, child))
        proc.start()
        child.close()
        conn, _ = ls.accept()
    try:
        parent.recv()                                   # sender ready
        if split:
            os.sched_setaffinity(proc.pid, {TX_CPU})
            os.sched_setaffinity(0, {RX_CPU})
        parent.send(Start(duration))
        with conn:
            stats = make_engine(engine, EngineOptions(bufsize=size)).run(conn, None)
        parent.recv()                                   # sender's result
    finally:
        os.sched_setaffinity(0, mask)
        proc.join(10)
        parent.close()
    return stats.bytes * 8 / stats.seconds() / 1e9


def through_server(address: str, engine: str, duration: float, size: int, split: bool) -> float:
    # Absolute pins rather than --pin-off: on loopback the RX CPU is wherever the sender happened
    # to run, so the same fixed placement as in-process needs absolute CPUs.
    pins = {"rx_app_cpu": RX_CPU, "tx_app_cpu": TX_CPU} if split else {}
    res = run(ClientOptions(src=address, dst=address, duration=duration, rx_engine=engine,
                            read_size=size, write_size=size, **pins))
    if res.summary.ok != 1 or res.summary.gbps is None:
        sys.exit(f"flow failed: {res.flows[0].reason}")
    return res.summary.gbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="epoll")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--no-split", dest="split", action="store_false",
                    help="leave both ends unpinned")
    a = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "zcnet", "server", "--listen",
                               "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().rsplit(" ", 1)[1].strip()
        ip, sv = [], []
        for r in range(a.rounds):
            # Alternate which goes first, so that neither always inherits the other's state.
            runs = [lambda: ip.append(in_process(a.engine, a.duration, a.size, a.split)),
                    lambda: sv.append(through_server(address, a.engine, a.duration, a.size,
                                                     a.split))]
            for go in runs if r % 2 == 0 else runs[::-1]:
                go()
            print(f"round {r + 1}: in-process {ip[-1]:.2f} Gbit/s   server/client "
                  f"{sv[-1]:.2f} Gbit/s")
    finally:
        server.terminate()
        server.wait()
    i, s = statistics.median(ip), statistics.median(sv)
    ratio = s / i
    place = "split" if a.split else "unpinned"
    print(f"median ({a.engine}, {a.size} B, {place}): in-process {i:.2f} Gbit/s, server/client "
          f"{s:.2f} Gbit/s, ratio {ratio:.2f}x (target >= 0.95x: "
          f"{'met' if ratio >= 0.95 else 'NOT met'})")


if __name__ == "__main__":
    main()
