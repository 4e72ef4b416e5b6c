"""zcnet's receive engines against iperf3 in the same lab, placement, duration and write size.

Usage (root): python benchmarks/bench_vs_iperf3.py [--mtus 1500,4096,9000] [--placement split]
              [--duration 3] [--repeat 5] [--write-size 1048576]

Every sender writes ``--write-size`` bytes per call: zcnet's own flows write 1 MiB, and iperf3
gets the same with ``-l`` (its default is 128 KiB, which hands the comparison to whoever writes
bigger). Each repeat runs every engine and iperf3 once per MTU, so drift on a shared machine
hits every column alike; the median over repeats is compared. kperf is not packaged here, so
iperf3 is the only C peer. Ends with one ``target`` line per MTU: zcnet's best engine over the
best peer, goal >= 1.0.
"""

from __future__ import annotations

import argparse
import statistics

from zcnet.bench.run import DEFAULT_ENGINES, BenchOptions, run_bench

PEERS = ("iperf3",)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mtus", default="1500,4096,9000")
    ap.add_argument("--placement", default="split")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    ap.add_argument("--write-size", type=int, default=1 << 20)
    args = ap.parse_args()
    engines = tuple(args.engines.split(","))
    mtus = tuple(int(m) for m in args.mtus.split(","))
    runs: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.repeat):
        doc = run_bench(BenchOptions(mtus=mtus, engines=engines, placements=(args.placement,),
                                     duration=args.duration, peers=PEERS, lab=True,
                                     peer_write_size=args.write_size))
        for r in doc["results"]:
            if r["status"] == "ok":
                runs.setdefault((r["mtu"], r["engine"]), []).append(r["gbps"])
            else:
                print(f"MTU {r['mtu']} {r['engine']}: {r['status']}: {r['reason']}")
    print(f"placement {args.placement}, {args.duration:g} s x {args.repeat} interleaved repeats, "
          f"every sender writing {args.write_size} bytes per call; medians")
    print(f"{'MTU':>6} {'engine':<14}{'Gbit/s':>9}{'range':>16}{'vs best peer':>14}")
    for mtu in mtus:
        med = {e: statistics.median(v) for (m, e), v in runs.items() if m == mtu}
        peer = max((med[p] for p in PEERS if p in med), default=None)
        for (m, e), v in runs.items():
            if m != mtu:
                continue
            ratio = f"{med[e] / peer:.2f}x" if peer else "n/a"
            print(f"{mtu:>6} {e:<14}{med[e]:>9.2f}{f'{min(v):.1f}..{max(v):.1f}':>16}"
                  f"{ratio:>14}")
        best = max((v for e, v in med.items() if e not in PEERS), default=None)
        if best is not None and peer:
            print(f"target lab_mtu{mtu}_best_zcnet_vs_best_peer {best / peer:.3f} x goal >= 1.0")


if __name__ == "__main__":
    main()
