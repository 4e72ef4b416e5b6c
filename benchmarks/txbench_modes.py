"""Packet rate per txbench mode in one lab, against single sends and against iperf3 (C, one
sendto per packet) in the same run. Target: the best batched mode >= 3x `single` Mpps.

    python benchmarks/txbench_modes.py [--duration 1] [--repeat 5] [--size 64] [--burst 32]

A second table sends the same streams to an ifb device in a namespace of its own: ifb frees
every packet, so that is the transmit path alone (what pktgen into a NIC measures), without the
receive work veth makes the sender's CPU do. Needs root. Prints numbers and ratios only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

from zcnet.bench.records import MeanSd, ResultFile
from zcnet.bench.txbench import ALL_MODES, run_txbench
from zcnet.lab import Lab
from zcnet.netns import in_netns

TARGET = 3.0


def iperf3_pps(size: int, seconds: float) -> float | None:
    """iperf3 UDP at full speed with ``size``-byte payloads between the lab's namespaces."""
    if shutil.which("iperf3") is None:
        return None
    with Lab() as lab:
        server = lab.ns_exec(lab.ns_b, ["iperf3", "-s", "-1", "-B", lab.addr_b, "-p", "5299"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        client = lab.ns_exec(lab.ns_a, ["iperf3", "-c", lab.addr_b, "-p", "5299", "-u", "-b", "0",
                                        "-l", str(size), "-t", str(max(1, round(seconds))), "-J"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, _ = client.communicate(timeout=seconds + 20)
        server.wait(timeout=10)
    try:
        end = json.loads(out)["end"]["sum"]
    except (ValueError, KeyError):
        return None
    return end["packets"] / end["seconds"] / 1e6


@contextlib.contextmanager
def ifb_namespace() -> Iterator[str]:
    name = f"zctxbench{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for cmd in (["link", "add", "d0", "type", "ifb"],
                    ["addr", "add", "198.18.200.1/24", "dev", "d0"],
                    ["link", "set", "d0", "up"]):
            subprocess.run(["ip", "-n", name, *cmd], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def _mean(stat: MeanSd | None) -> float:
    return stat.mean if stat is not None and stat.mean is not None else math.nan


def _sd(stat: MeanSd | None) -> float:
    return stat.stdev if stat is not None and stat.stdev is not None else math.nan


def print_table(doc: ResultFile, peer: float | None) -> None:
    summary = doc.summary if isinstance(doc.summary, dict) else {}
    base = _mean(summary["single"].mpps)
    print(f"{'mode':8} {'Mpps':>16} {'x single':>9} {'CPU ns/pkt':>14} {'sink drops':>11}")
    for mode, s in summary.items():
        if s.status != "ok":
            print(f"{mode:8} {s.status}: {s.reason or ''}")
            continue
        m, ns = s.mpps, s.ns_per_pkt
        drops = "-" if s.drops is None else s.drops
        print(f"{mode:8} {_mean(m):8.3f} ± {_sd(m):.3f} {_mean(m) / base:8.2f}x "
              f"{_mean(ns):8.0f} ± {_sd(ns):<4.0f} {drops:>11}")
    if peer is not None:
        print(f"{'iperf3':8} {peer:8.3f}         {peer / base:8.2f}x   (C, sendto per packet)")
    batched = {m: _mean(s.mpps) for m, s in summary.items() if m != "single" and s.status == "ok"}
    best = max(batched, key=batched.__getitem__)
    ratio = batched[best] / base
    print(f"best batched: {best} {ratio:.2f}x single (target >= {TARGET:.0f}x: "
          f"{'met' if ratio >= TARGET else 'NOT met'})")
    if peer:
        print(f"best batched vs iperf3: {batched[best] / peer:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--burst", type=int, default=32)
    args = ap.parse_args()

    doc = run_txbench(modes=ALL_MODES, size=args.size, burst=args.burst,
                      duration=args.duration, repeat=args.repeat)
    peer = iperf3_pps(args.size, args.duration * 2)
    print(f"UDP payload {args.size} B, burst {args.burst}, {args.repeat} x {args.duration} s "
          f"per mode; {doc.env.cpus} CPUs, kernel {doc.env.kernel}")
    print("\n-- lab veth into the sink (the sender's CPU also runs the receive path)")
    print_table(doc, peer)
    with ifb_namespace() as ns, in_netns(ns):
        tx_only = run_txbench(modes=ALL_MODES, size=args.size, burst=args.burst,
                              duration=args.duration, repeat=args.repeat, dst="198.18.200.2:9")
    print("\n-- transmit path only: into an ifb device that frees every packet")
    print_table(tx_only, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
