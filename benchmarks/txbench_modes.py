"""Packet rate per txbench mode in one lab, against single sends and against iperf3 (C, one
sendto per packet) in the same run. Target: the best batched mode >= 3x `single` Mpps.

    python benchmarks/txbench_modes.py [--duration 1] [--repeat 5] [--size 64] [--burst 32]

Needs root (namespaces). Prints numbers and ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time

from zcnet.lab import Lab
from zcnet.tx.txbench import ALL_MODES, run_txbench

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
    summary = doc["summary"]
    base = summary["single"]["mpps"]["mean"]
    print(f"UDP payload {args.size} B, burst {args.burst}, {args.repeat} x {args.duration} s "
          f"per mode, lab veth; {doc['env']['cpus']} CPUs, kernel {doc['env']['kernel']}")
    print(f"{'mode':8} {'Mpps':>16} {'x single':>9} {'CPU ns/pkt':>14} {'sink drops':>11}")
    for mode, s in summary.items():
        if s["status"] != "ok":
            print(f"{mode:8} {s['status']}: {s.get('reason', '')}")
            continue
        m, ns = s["mpps"], s["ns_per_pkt"]
        print(f"{mode:8} {m['mean']:8.3f} ± {m['stdev']:.3f} {m['mean'] / base:8.2f}x "
              f"{ns['mean']:8.0f} ± {ns['stdev']:<4.0f} {s.get('drops', '-'):>11}")
    if peer is not None:
        print(f"{'iperf3':8} {peer:8.3f}         {peer / base:8.2f}x   (C, sendto per packet)")
    batched = {m: s["mpps"]["mean"] for m, s in summary.items()
               if m != "single" and s["status"] == "ok"}
    best = max(batched, key=batched.__getitem__)
    ratio = batched[best] / base
    print(f"best batched: {best} {ratio:.2f}x single (target >= {TARGET:.0f}x: "
          f"{'met' if ratio >= TARGET else 'NOT met'})")
    if peer:
        print(f"best batched vs iperf3: {batched[best] / peer:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
