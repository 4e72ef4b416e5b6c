"""zcrx zero-copy vs zcrx copy mode vs epoll on one netdevsim queue: receiver CPU per GiB, ratios.

Runs inside zcnet's netdevsim test kernel, whose netdevsim writes received payload into the
queue's page pool through the DMA address (a CPU copy standing in for a NIC's DMA engine):

    zcnet vm run --kernel nsim -- python benchmarks/zcrx_nsim.py [--rounds 3] [--mib 256]

A netdevsim lab with `nic setup` on side b (header-data split, hds-thresh 0, a flow rule
steering the data port to queue 2, RSS off it); one TCP flow per run from side a, received
on side b by, in rotating order:

- ``zcrx-zc``: zcrx registered on queue 2 (device mode): payload lands in the area by the
  simulated DMA, the kernel copies nothing (its own counter, ``kernel_copied_bytes``, is shown);
- ``zcrx-copy``: zcrx in the kernel's copy mode (ZCRX_REG_NODEV): the receive path copies every
  byte into the area;
- ``epoll``: non-blocking ``recv_into`` of 1 MiB, the copying baseline.

Receiver CPU is getrusage of the receiving thread (the sender is another thread, and the
netdevsim softirq, where the simulated DMA copies, runs on the sending CPU: a NIC's DMA costs
no CPU at all). Under TCG absolute numbers mean little: ratios are the result. Medians over
rounds are compared. Targets: zcrx-zc CPU per GiB below zcrx-copy's and epoll's.
"""

from __future__ import annotations

import argparse
import platform
import resource
import socket
import statistics
import sys
import threading
import time

from zcnet.lab import Lab
from zcnet.netns import in_netns
from zcnet.nic import setup
from zcnet.pattern import PERIOD, TILED
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import make_engine
from zcnet.rx.zc.zcrx import kernel_offers

QUEUES, QUEUE, PORT = 4, 2, 9999
CELLS = ("zcrx-zc", "zcrx-copy", "epoll")


def _send(sock: socket.socket, total: int, errors: list[BaseException]) -> None:
    mv = memoryview(TILED)
    try:
        with sock:
            sent = 0
            while sent < total:
                start = sent % PERIOD
                sent += sock.send(mv[start:start + min(1 << 20, total - sent)])
    except OSError as e:
        errors.append(e)


def _pair(lab: Lab) -> tuple[socket.socket, socket.socket]:
    with in_netns(lab.ns_b):
        listener = socket.create_server((lab.addr_b, PORT))
    with listener:
        with in_netns(lab.ns_a):
            client = socket.create_connection((lab.addr_b, PORT), timeout=120)
        server, _ = listener.accept()
    return client, server


def run_cell(lab: Lab, cell: str, total: int) -> tuple[float, float, dict[str, object]]:
    """(Gbit/s, receiver CPU seconds per GiB, engine stats) of one flow of ``total`` bytes."""
    opts = EngineOptions()
    if cell == "zcrx-zc":
        opts.ifname, opts.queue = lab.if_b, QUEUE
    eng = make_engine("epoll" if cell == "epoll" else "zcrx", opts)
    client, server = _pair(lab)
    errors: list[BaseException] = []
    with server:
        with in_netns(lab.ns_b):  # a device-mode zcrx registers on side b's port
            if why := eng.unsupported():
                client.close()
                raise SystemExit(f"{cell}: unsupported: {why}")
        sender = threading.Thread(target=_send, args=(client, total, errors))
        before = resource.getrusage(resource.RUSAGE_THREAD)
        t0 = time.perf_counter()
        sender.start()
        with in_netns(lab.ns_b):
            st = eng.run(server, None)
        dt = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_THREAD)
        sender.join()
    if errors or st.bytes != total:
        raise SystemExit(f"{cell}: got {st.bytes}/{total} bytes {errors}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return st.bytes * 8 / dt / 1e9, cpu / (total / (1 << 30)), st.extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256, help="MiB per flow")
    args = ap.parse_args()
    if not kernel_offers().copy_mode:
        print(f"kernel {platform.release()} has no zcrx copy mode (7.x); run inside "
              "`zcnet vm run --kernel nsim`", file=sys.stderr)
        return 2
    total = args.mib << 20
    gbps: dict[str, list[float]] = {c: [] for c in CELLS}
    cpu: dict[str, list[float]] = {c: [] for c in CELLS}
    stats: dict[str, dict[str, object]] = {}
    with Lab(device="netdevsim", queues=QUEUES) as lab, \
            setup.applied(setup.NicConfig(lab.if_b, QUEUE, PORT, netns=lab.ns_b)):
        run_cell(lab, "epoll", 8 << 20)  # warm-up: first-use costs land in no cell
        for r in range(args.rounds):
            for cell in CELLS[r % 3:] + CELLS[:r % 3]:
                g, c, stats[cell] = run_cell(lab, cell, total)
                gbps[cell].append(g)
                cpu[cell].append(c)
    print(f"kernel {platform.release()}, netdevsim queue {QUEUE} (simulated DMA), "
          f"{args.mib} MiB per flow, {args.rounds} rounds; receiver thread CPU")
    med = {c: statistics.median(cpu[c]) for c in CELLS}
    for c in CELLS:
        copied = stats[c].get("kernel_copied_bytes", "all (a copying receive)")
        print(f"  {c:9s} {statistics.median(gbps[c]):7.3f} Gbit/s  receiver CPU "
              f"{med[c] * 1000:8.1f} ms per GiB (range {min(cpu[c]) * 1000:.1f}.."
              f"{max(cpu[c]) * 1000:.1f})  kernel-copied bytes {copied}")
    for peer in ("zcrx-copy", "epoll"):
        print(f"target zc_cpu_vs_{peer.replace('-', '_')} {med['zcrx-zc'] / med[peer]:.2f} x "
              "goal < 1.0")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
