"""zcnet's receive engines against iperf3 in the same lab, placement and duration.

Usage (root): python benchmarks/bench_vs_iperf3.py [--mtu 9000] [--placement split]
              [--duration 3] [--repeat 3]
Prints Gbit/s per engine (mean of the repeats, interleaved so drift hits every column alike) and
each engine's ratio to iperf3.
"""

from __future__ import annotations

import argparse
import statistics

from zcnet.bench.run import DEFAULT_ENGINES, BenchOptions, run_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--placement", default="split")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    args = ap.parse_args()
    engines = tuple(args.engines.split(","))
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        doc = run_bench(BenchOptions(mtus=(args.mtu,), engines=engines,
                                     placements=(args.placement,), duration=args.duration,
                                     peers=("iperf3",), lab=True))
        for r in doc["results"]:
            if r["status"] == "ok":
                runs.setdefault(r["engine"], []).append(r["gbps"])
            else:
                print(f"{r['engine']}: {r['status']}: {r['reason']}")
    ref = statistics.mean(runs["iperf3"]) if runs.get("iperf3") else None
    print(f"MTU {args.mtu}, placement {args.placement}, {args.duration:g} s x {args.repeat}")
    print(f"{'engine':<14}{'Gbit/s':>9}{'stdev':>8}{'vs iperf3':>11}")
    for name, vals in runs.items():
        mean = statistics.mean(vals)
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        ratio = f"{mean / ref:.2f}x" if ref else "n/a"
        print(f"{name:<14}{mean:>9.2f}{sd:>8.2f}{ratio:>11}")


if __name__ == "__main__":
    main()
