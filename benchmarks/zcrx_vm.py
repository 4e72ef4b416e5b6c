"""zcrx in copy mode vs soft-zc, same run, same loopback flow: Gbit/s, receiver CPU per GiB, ratio.

Needs a kernel with zcrx copy mode (ZCRX_REG_NODEV, 7.x), e.g. inside `zcnet vm run`:

    zcnet vm run -- python benchmarks/zcrx_vm.py [--rounds 3] [--mib 256] [--verify]

Both engines receive into a registered area and hand buffers back on release; in zcrx copy mode
the kernel copies into 4 KiB zcrx buffers and the refill ring is flushed (ZCRX_CTRL_FLUSH_RQ),
soft-zc copies into 1 MiB provided buffers. Under TCG absolute numbers mean little; the ratio is
what counts. Rounds alternate the order so drift hits both alike; medians are compared.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys

from zc_rx import run_engine

from zcnet.rx.zc.zcrx import kernel_offers

CELLS = {  # label: (engine, options)
    "zcrx-copy": ("zcrx", {}),
    "soft-zc": ("soft-zc", {"consumer": "same"}),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256, help="MiB per run")
    ap.add_argument("--verify", action="store_true", help="consumers verify every byte")
    args = ap.parse_args()
    if not kernel_offers().copy_mode:
        print(f"kernel {platform.release()} has no zcrx copy mode (7.x); run inside "
              "`zcnet vm run`", file=sys.stderr)
        return 2
    total = args.mib << 20
    gbps: dict[str, list[float]] = {k: [] for k in CELLS}
    cpu: dict[str, list[float]] = {k: [] for k in CELLS}
    stats: dict[str, dict[str, int]] = {}
    names = list(CELLS)
    for r in range(args.rounds):
        for key in names[r % 2:] + names[:r % 2]:
            eng, opts = CELLS[key]
            before = resource.getrusage(resource.RUSAGE_SELF)
            g, stats[key] = run_engine(eng, total, args.verify, **opts)
            after = resource.getrusage(resource.RUSAGE_SELF)
            gbps[key].append(g)
            used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            cpu[key].append(used / args.mib * 1024)
    print(f"kernel {platform.release()}, loopback, {args.mib} MiB per run, {args.rounds} rounds, "
          f"verify={args.verify}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    med = {k: statistics.median(v) for k, v in gbps.items()}
    per_gib = {k: statistics.median(v) for k, v in cpu.items()}
    for k in CELLS:
        print(f"  {k:10s} median {med[k]:6.3f} Gbit/s (range {min(gbps[k]):.3f}.."
              f"{max(gbps[k]):.3f}); receiver CPU {per_gib[k]:6.2f} s per GiB")
    z = stats["zcrx-copy"]
    print(f"  zcrx-copy stats: zcrx_copy {z.get('zcrx_copy')}, rx_buf_len {z.get('rx_buf_len')}, "
          f"delivered {z.get('delivered')}, rearms {z.get('rearms')}, "
          f"refill_full {z.get('refill_full')}")
    print(f"  zcrx-copy / soft-zc throughput = {med['zcrx-copy'] / med['soft-zc']:.2f}x")
    print(f"  zcrx-copy / soft-zc CPU per GiB = {per_gib['zcrx-copy'] / per_gib['soft-zc']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
