"""zcnet's receive engines against iperf3 in the same lab, placement, duration and write size.

Usage (root): python benchmarks/bench_vs_iperf3.py [--mtus 1500,4096,9000] [--placement split]
              [--duration 3] [--repeat 5] [--write-size 1048576]

Every sender writes ``--write-size`` bytes per call: zcnet's own flows write 1 MiB, and iperf3
gets the same with ``-l`` (its default is 128 KiB, which hands the comparison to whoever writes
bigger). Each repeat runs every engine and iperf3 once per MTU, so drift on a shared machine
hits every column alike; the median over repeats is compared. kperf is not packaged here (and
cannot be fetched), so iperf3 is the only C peer. Both ends of every column are pinned alike
(the placement's CPUs, taskset for iperf3). The engines run with their own SO_RCVLOWAT
(engine option ``rcvlowat``): epoll wakes on any data, as iperf3 does; the io_uring engines
wake once 1 MiB is queued (see zcnet.rx.copying). ``--rcvlowat N`` gives every engine N.
Ends with one ``target`` line per MTU: zcnet's best engine over the best peer, goal >= 1.0.

Every lab here, the C pair's too, receives on the sender's CPU (``Lab.steer_rx``, as ``zcnet
bench`` does): left to veth, one flow is received on two CPUs and reordered, thousands of
segments are retransmitted per run and every column swings by a third or more between runs.
``--no-rx-steer`` runs them as veth does.

A third kind of row, ``c-pair``, is a plain C sender and receiver (compiled at run time with the
system compiler; skipped with a note when there is none; ``--no-c-pair`` leaves it out): blocking
writes of ``--write-size`` bytes, a non-blocking ``read`` of 1 MiB with ``poll`` on EAGAIN and no
SO_RCVLOWAT (as iperf3 reads), pinned like the placement, in a lab of its own per MTU. It is not
a target peer. It answers where a gap to iperf3 comes from: if a 40-line C pair with no Python
in it lands where zcnet does, the gap is not Python's per-call cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile

from zcnet.bench.cbuild import compile_c
from zcnet.bench.peers import netns_argv
from zcnet.bench.run import DEFAULT_ENGINES, BenchOptions, pick_cpus, run_bench, steer
from zcnet.lab import Lab
from zcnet.rx.engine import RCVLOWAT

PEERS = ("iperf3",)
C_PAIR = "c-pair"
C_PORT = 5301

_C_COMMON = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
"""
# argv: ADDR PORT SECONDS WRITE_SIZE. Blocking writes of WRITE_SIZE bytes for SECONDS.
_C_SEND = _C_COMMON + r"""
int main(int argc, char **argv) {
    if (argc != 5) return 2;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    size_t n = strtoul(argv[4], NULL, 10);
    char *b = malloc(n);
    if (!b) return 1;
    for (size_t i = 0; i < n; i++) b[i] = (char)(i * 7);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    for (int i = 0; connect(fd, (void *)&a, sizeof a) < 0; i++) {
        if (i == 200) { perror("connect"); return 1; }
        usleep(10000);
    }
    double end = now() + atof(argv[3]);
    while (now() < end)
        if (write(fd, b, n) < 0) { perror("write"); return 1; }
    close(fd);
    return 0;
}
"""
# argv: ADDR PORT. One connection; prints its Gbit/s from the first byte to EOF.
_C_RECV = _C_COMMON + r"""
#include <fcntl.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) { perror("listen"); return 1; }
    int fd = accept(l, NULL, NULL);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    char *b = malloc(1 << 20);
    long long got = 0;
    double t0 = 0;
    for (;;) {
        ssize_t k = read(fd, b, 1 << 20);
        if (k == 0) break;
        if (k < 0) {
            if (errno != EAGAIN) { perror("read"); return 1; }
            struct pollfd p = {fd, POLLIN, 0};
            poll(&p, 1, -1);
            continue;
        }
        if (!t0) t0 = now();
        got += k;
    }
    printf("%.3f\n", got * 8 / (now() - t0) / 1e9);
    return 0;
}
"""


def build_c_pair(workdir: str) -> tuple[tuple[str, str] | None, str]:
    """(sender, receiver) executables, or None and why not."""
    send, note = compile_c(_C_SEND, workdir, "csend", C_PAIR)
    recv, note = compile_c(_C_RECV, workdir, "crecv", C_PAIR) if send else (None, note)
    return ((send, recv) if send and recv else None), note


def run_c_pair(exes: tuple[str, str], mtu: int, placement: str, duration: float,
               write_size: int, rx_steer: bool = True) -> float | str:
    """The C pair's Gbit/s in a lab of its own, or why it did not run."""
    cpus = pick_cpus(placement)
    if isinstance(cpus, str):
        return cpus
    tx_cpu, rx_cpu = cpus
    with Lab(mtu=mtu) as lab:
        if rx_steer:
            steer(lab)  # as run_bench's lab: received on the sender's CPU, in order
        rx = subprocess.Popen(netns_argv(lab.ns_b, rx_cpu, [exes[1], lab.addr_b, str(C_PORT)]),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            tx = subprocess.run(netns_argv(lab.ns_a, tx_cpu, [exes[0], lab.addr_b, str(C_PORT),
                                                              str(duration), str(write_size)]),
                                capture_output=True, text=True, timeout=duration + 30)
            out, err = rx.communicate(timeout=30)
        finally:
            if rx.poll() is None:
                rx.kill()
                rx.wait()
        if tx.returncode or rx.returncode:
            return f"c-pair failed: {(tx.stderr + err).strip()[:200]}"
        return float(out.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mtus", default="1500,4096,9000")
    ap.add_argument("--placement", default="split")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES))
    ap.add_argument("--write-size", type=int, default=1 << 20)
    ap.add_argument("--rcvlowat", type=int, default=None,
                    help="every zcnet engine's SO_RCVLOWAT in bytes (0: wake on any data, as "
                         "iperf3; default: each engine's own, epoll 0 and the others "
                         f"{RCVLOWAT})")
    ap.add_argument("--no-rx-steer", dest="rx_steer", action="store_false",
                    help="leave the lab's receive where veth puts it (see zcnet.lab.topology)")
    ap.add_argument("--no-c-pair", dest="c_pair", action="store_false",
                    help="leave out the plain C sender/receiver row")
    args = ap.parse_args()
    load0 = _load()
    engines = tuple(args.engines.split(","))
    mtus = tuple(int(m) for m in args.mtus.split(","))
    runs: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="zcnet-cpair-") as tmp:
        exes, note = build_c_pair(tmp) if args.c_pair else (None, "c-pair: left out")
        _measure(args, engines, mtus, runs, exes)
    lowat = ("each engine's own" if args.rcvlowat is None else args.rcvlowat)
    steered = "steered to the sender's CPU" if args.rx_steer else "unsteered (--no-rx-steer)"
    print(f"lab receive {steered}; "
          f"placement {args.placement}, {args.duration:g} s x {args.repeat} interleaved repeats, "
          f"every sender writing {args.write_size} bytes per call; medians; zcnet engines' "
          f"SO_RCVLOWAT {lowat} (iperf3: none); C peers: iperf3 only (kperf is not "
          f"packaged here); {note}; load average before {load0}, after {_load()}")
    _report(mtus, runs)


def _measure(args: argparse.Namespace, engines: tuple[str, ...], mtus: tuple[int, ...],
             runs: dict[tuple[int, str], list[float]], exes: tuple[str, str] | None) -> None:
    for _ in range(args.repeat):
        doc = run_bench(BenchOptions(mtus=mtus, engines=engines, placements=(args.placement,),
                                     duration=args.duration, peers=PEERS, lab=True,
                                     peer_write_size=args.write_size, rx_steer=args.rx_steer,
                                     engine_opts=({} if args.rcvlowat is None
                                                  else {"rcvlowat": args.rcvlowat})))
        for r in doc.results:
            if r.ok and r.mtu is not None and r.engine and r.gbps is not None:
                runs.setdefault((r.mtu, r.engine), []).append(r.gbps)
            else:
                print(f"MTU {r.mtu} {r.engine}: {r.status}: {r.reason}")
        for mtu in mtus if exes else ():
            res = run_c_pair(exes, mtu, args.placement, args.duration, args.write_size,
                             args.rx_steer)
            if isinstance(res, str):
                print(f"MTU {mtu} {C_PAIR}: {res}")
            else:
                runs.setdefault((mtu, C_PAIR), []).append(res)


def _report(mtus: tuple[int, ...], runs: dict[tuple[int, str], list[float]]) -> None:
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
        best = max((v for e, v in med.items() if e not in (*PEERS, C_PAIR)), default=None)
        if best is not None and peer:
            print(f"target lab_mtu{mtu}_best_zcnet_vs_best_peer {best / peer:.3f} x goal >= 1.0")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
