"""The kernel's page-mapping receive (TCP_ZEROCOPY_RECEIVE) against a plain copy, on loopback.

    python benchmarks/tcp_zc_loopback.py [--mib 2048] [--repeat 3] [--cpu 0] [--pages both]

Why it is here: on one CPU every zcnet.aio receiver ends near uvloop's throughput because the
kernel's copy into the receiver is a fixed share of all the work (docs/aio.md). zcrx needs a
NIC; TCP_ZEROCOPY_RECEIVE is the one zero-copy receive loopback has, so this measures whether it
gets below the copy there. A C sender and receiver (compiled at run time; skipped with a note
when there is no compiler) share one CPU; the receiver either ``read``s 1 MiB at a time or maps
up to 1 MiB of payload pages per ``getsockopt(TCP_ZEROCOPY_RECEIVE)`` into a window mmap'ed on
the socket, taking what cannot be mapped through its copy buffer.

It maps only order-0 pages; the sender's pages are compound (32 KiB) unless
``net.core.high_order_alloc_disable`` is 1. ``--pages order0`` (root) sets that sysctl for its
rows and puts the old value back afterwards, on an error and on Ctrl-C too; it is
machine-wide while it runs. Rows: Gbit/s (median over repeats), the share of bytes mapped, and
the ratio to ``read`` under the same pages. No targets: the numbers answer a question.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from zcnet.bench.cbuild import compile_c

SYSCTL = "/proc/sys/net/core/high_order_alloc_disable"

# argv: MODE(read|zc) MIB CPU. Prints "GBIT MAPPED_BYTES TOTAL_BYTES".
_C = r"""
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define WINDOW (1 << 20)
#define SOL_TCP_ 6
#define TCP_ZEROCOPY_RECEIVE_ 35
struct zc_receive {  /* struct tcp_zerocopy_receive, include/uapi/linux/tcp.h */
    uint64_t address; uint32_t length, recv_skip_hint, inq; int32_t err;
    uint64_t copybuf_address; int32_t copybuf_len; uint32_t flags;
    uint64_t msg_control, msg_controllen; uint32_t msg_flags, reserved;
};
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static int fail(const char *what) { perror(what); return 1; }
static int ended(void) { fprintf(stderr, "the sender ended early\n"); return 1; }
int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int zc = !strcmp(argv[1], "zc");
    long long total = atoll(argv[2]) << 20;
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(atoi(argv[3]), &cs);
    if (sched_setaffinity(0, sizeof cs, &cs)) return fail("sched_setaffinity");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t al = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(l, (void *)&a, sizeof a) || listen(l, 1) || getsockname(l, (void *)&a, &al))
        return fail("listen");
    pid_t kid = fork();
    if (kid == 0) {  /* the sender: 1 MiB writes from a page-aligned buffer */
        int s = socket(AF_INET, SOCK_STREAM, 0);
        char *b = aligned_alloc(4096, WINDOW);
        if (!b || connect(s, (void *)&a, sizeof a)) _exit(1);
        memset(b, 'z', WINDOW);
        for (long long left = total; left > 0;) {
            ssize_t n = write(s, b, left < WINDOW ? left : WINDOW);
            if (n <= 0) _exit(1);
            left -= n;
        }
        close(s);
        _exit(0);
    }
    int s = accept(l, NULL, NULL);
    if (s < 0) return fail("accept");
    char *copy = malloc(WINDOW);
    void *win = zc ? mmap(NULL, WINDOW, PROT_READ, MAP_SHARED, s, 0) : NULL;
    if (!copy || win == MAP_FAILED) return fail("buffers");
    long long got = 0, mapped = 0;
    double t0 = now();
    while (got < total) {
        if (!zc) {
            ssize_t n = read(s, copy, WINDOW);
            if (n <= 0) return n ? fail("read") : ended();
            got += n;
            continue;
        }
        struct zc_receive z = {.address = (uintptr_t)win, .length = WINDOW,
                               .copybuf_address = (uintptr_t)copy, .copybuf_len = WINDOW};
        socklen_t zl = sizeof z;
        if (getsockopt(s, SOL_TCP_, TCP_ZEROCOPY_RECEIVE_, &z, &zl)) return fail("getsockopt");
        if (z.err) { fprintf(stderr, "socket error %d\n", z.err); return 1; }
        long long c = z.copybuf_len > 0 ? z.copybuf_len : 0;
        got += z.length + c;
        mapped += z.length;
        if (z.recv_skip_hint && !c) {  /* bytes it would neither map nor copy: read them */
            ssize_t n = read(s, copy, z.recv_skip_hint);
            if (n <= 0) return n ? fail("read") : ended();
            got += n;
        } else if (!z.length && !c) {  /* nothing yet: wait; readable with nothing is EOF */
            struct pollfd p = {s, POLLIN, 0};
            char x;
            if (poll(&p, 1, -1) < 0) return fail("poll");
            if (recv(s, &x, 1, MSG_PEEK | MSG_DONTWAIT) == 0) return ended();
        }
    }
    double dt = now() - t0;
    int st;
    if (waitpid(kid, &st, 0) != kid || !WIFEXITED(st) || WEXITSTATUS(st)) return fail("sender");
    printf("%.3f %lld %lld\n", got * 8 / dt / 1e9, mapped, got);
    return 0;
}
"""


@contextmanager
def order0_pages() -> Iterator[None]:
    """Order-0 sender pages (the sysctl set to 1) for the block, the old value back after."""
    with open(SYSCTL) as f:
        old = f.read().strip()
    with open(SYSCTL, "w") as f:
        f.write("1")
    try:
        yield
    finally:
        with open(SYSCTL, "w") as f:
            f.write(old)


def run_pair(exe: str, mode: str, mib: int, cpu: int) -> tuple[float, float]:
    """(Gbit/s, share of bytes mapped) of one run."""
    try:
        p = subprocess.run([exe, mode, str(mib), str(cpu)], capture_output=True, text=True,
                           timeout=300)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"the {mode} pair did not finish {mib} MiB in 300 s") from None
    if p.returncode:
        raise SystemExit(f"the {mode} pair failed: {p.stderr.strip()[:300]}")
    gbit, mapped, total = p.stdout.split()
    return float(gbit), int(mapped) / int(total)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=2048, help="MiB per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)),
                    help="the CPU both ends share")
    ap.add_argument("--pages", choices=("compound", "order0", "both"), default="both")
    args = ap.parse_args()
    if args.mib <= 0 or args.repeat <= 0:
        ap.error("--mib and --repeat must be positive")
    if args.cpu not in os.sched_getaffinity(0):
        ap.error(f"--cpu {args.cpu} is not a CPU this process may run on")
    kinds = ["compound", "order0"] if args.pages == "both" else [args.pages]
    if "order0" in kinds and os.geteuid() != 0:
        print("order-0 rows skipped: setting net.core.high_order_alloc_disable needs root")
        kinds.remove("order0")
    with tempfile.TemporaryDirectory() as tmp:
        exe, note = compile_c(_C, tmp, "tcpzc", "the C pair")
        if exe is None:
            print(note)
            return 0
        print(f"loopback, one CPU ({args.cpu}), {args.mib} MiB per run, median of "
              f"{args.repeat}, {note}, kernel {os.uname().release}")
        medians: dict[tuple[str, str], float] = {}
        for kind in kinds:
            rows: dict[str, list[tuple[float, float]]] = {"read": [], "zc": []}
            with order0_pages() if kind == "order0" else nullcontext():
                for _ in range(args.repeat):  # interleaved: drift hits both alike
                    for mode in rows:
                        rows[mode].append(run_pair(exe, mode, args.mib, args.cpu))
            med = {m: statistics.median(g for g, _ in r) for m, r in rows.items()}
            for mode, label in (("read", "read 1 MiB"), ("zc", "TCP_ZEROCOPY_RECEIVE")):
                share = statistics.median(s for _, s in rows[mode])
                print(f"  {kind:8s} pages  {label:21s} {med[mode]:6.2f} Gbit/s  "
                      f"mapped {share:4.0%}  vs read {med[mode] / med['read']:.2f}x")
            medians.update({(kind, m): g for m, g in med.items()})
        if len(kinds) == 2:
            print(f"  TCP_ZEROCOPY_RECEIVE with the pages it maps vs read with the default "
                  f"pages: {medians['order0', 'zc'] / medians['compound', 'read']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
