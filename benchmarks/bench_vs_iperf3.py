"""zcnet's receive engines against iperf3 in the same lab, placement, duration and write size.

Usage (root): python benchmarks/bench_vs_iperf3.py [--mtus 1500,4096,9000] [--placement split]
              [--duration 3] [--repeat 5] [--write-size 1048576]

Every sender writes ``--write-size`` bytes per call: zcnet's own flows write 1 MiB, and iperf3
gets the same with ``-l`` (its default is 128 KiB, which hands the comparison to whoever writes
bigger). Each repeat runs every engine and iperf3 once per MTU, so drift on a shared machine
hits every column alike; the median over repeats is compared. kperf is not packaged here (and
cannot be fetched), so iperf3 is the only C peer. Both ends of every column are pinned alike
(the placement's CPUs, taskset for iperf3). zcnet's engines set SO_RCVLOWAT (engine option
``rcvlowat``, default 1 MiB: one wake-up per MiB queued, see zcnet.rx.engine); iperf3 has
no option for it and wakes on every segment. ``--rcvlowat 0`` runs the engines without it.
Ends with one ``target`` line per MTU: zcnet's best engine over the best peer, goal >= 1.0.
"""

from __future__ import annotations

import argparse
import os
import statistics

from zcnet.bench.run import DEFAULT_ENGINES, BenchOptions, run_bench
from zcnet.rx.engine import RCVLOWAT

PEERS = ("iperf3",)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mtus", default="1500,4096,9000")
    ap.add_argument("--placement", default="split")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    ap.add_argument("--write-size", type=int, default=1 << 20)
    ap.add_argument("--rcvlowat", type=int, default=RCVLOWAT,
                    help="zcnet engines' SO_RCVLOWAT in bytes (0: wake on any data, as iperf3)")
    args = ap.parse_args()
    load0 = _load()
    engines = tuple(args.engines.split(","))
    mtus = tuple(int(m) for m in args.mtus.split(","))
    runs: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.repeat):
        doc = run_bench(BenchOptions(mtus=mtus, engines=engines, placements=(args.placement,),
                                     duration=args.duration, peers=PEERS, lab=True,
                                     peer_write_size=args.write_size,
                                     engine_opts={"rcvlowat": args.rcvlowat}))
        for r in doc["results"]:
            if r["status"] == "ok":
                runs.setdefault((r["mtu"], r["engine"]), []).append(r["gbps"])
            else:
                print(f"MTU {r['mtu']} {r['engine']}: {r['status']}: {r['reason']}")
    print(f"placement {args.placement}, {args.duration:g} s x {args.repeat} interleaved repeats, "
          f"every sender writing {args.write_size} bytes per call; medians; zcnet engines' "
          f"SO_RCVLOWAT {args.rcvlowat} (iperf3: none); C peers: iperf3 only (kperf is not "
          f"packaged here); load average before {load0}, after {_load()}")
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


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
