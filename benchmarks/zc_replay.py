"""Replay: the zero-copy receive path's own user-space cost, with no kernel copy in the way.

    python benchmarks/zc_replay.py [--chunks 400000] [--batch 256] [--sizes 4,16,64]

A stand-in for the kernel writes completions into real ring memory exactly as the kernel lays
it out, and takes buffers back the way the kernel does; everything else is the real code:

- soft: SoftProvider over a real io_uring and a registered provided-buffer ring. The stand-in
  takes the next buffers in ring order from the buffer ring's memory (as the kernel's head does)
  and posts one RECV CQE per buffer (F_BUFFER | F_MORE, the buffer id in the upper flag bits)
  into the ring's CQ, mapped a second time at IORING_OFF_SQ_RING; the provider reaps, parses,
  accounts and writes the buffer ring back on release.
- zcrx: the real ZcrxProvider over a real CQE32 ring and its refill ring in user memory, built
  through its public constructor; only the registration (which needs a NIC that supports zcrx)
  is played by the stand-in, filling in the refill ring layout as the kernel does (head and
  tail on their own cache lines, then the rqes). It posts CQE32s whose second half carries the
  area offset (area id above bit 48) and consumes the refill ring as NAPI would.

The Receiver on top is the real one, driven through its public API in three ways: ``recv_batch``
(one Batch per round, one release), the iterator (``for chunk in rx: chunk.release()``) and
``recv`` + ``release_many``. The stand-in's own CPU time is measured with time.thread_time and
subtracted. Reported: user-space CPU ns per chunk and per GiB of payload, and chunks/s one
core reaches at that cost. A C program doing the same completion walk and refill (compiled at
run time with the system compiler; skipped with a note when there is none) runs in the same
script, and the ratio to it is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from zcnet.bench.cbuild import compile_c
from zcnet.errors import ZcnetError
from zcnet.rx.zc import soft, zcrx, zcrx_queue
from zcnet.rx.zc.api import Receiver
from zcnet.rx.zc.area import Area
from zcnet.rx.zc.provider import Delivery
from zcnet.uapi import io_uring as u
from zcnet.uring.mem import Mapping
from zcnet.uring.ring import Ring
from zcnet.uring.syscall import backend, io_uring_setup

MODES = ("recv_batch", "iterator", "release_many")
GIB = 1 << 30


# --- the kernel's side ---------------------------------------------------------------------------


def cq_layout(sq_entries: int, flags: int, cq_entries: int) -> dict[str, int]:
    """Offsets of the CQ ring for these setup parameters, from a throwaway ring (the kernel
    reports them at setup; they depend only on the parameters)."""
    p = u.io_uring_params(flags=flags | u.IORING_SETUP_CQSIZE, cq_entries=cq_entries)
    fd = io_uring_setup(sq_entries, p)
    os.close(fd)
    if not p.features & u.IORING_FEAT_SINGLE_MMAP:
        raise SystemExit("this kernel lacks IORING_FEAT_SINGLE_MMAP; the replay assumes it")
    cqe = 32 if flags & u.IORING_SETUP_CQE32 else 16
    size = max(p.sq_off.array + p.sq_entries * 4, p.cq_off.cqes + p.cq_entries * cqe)
    return {"head": p.cq_off.head, "tail": p.cq_off.tail, "cqes": p.cq_off.cqes,
            "entries": p.cq_entries, "size": size, "cqe": cqe}


class CqWriter:
    """Posts CQEs into a live ring's CQ the way the kernel does: entries at ``tail & mask``,
    then the tail store. It maps the ring memory a second time, so it needs nothing of Ring's
    internals."""

    def __init__(self, ring_fd: int, layout: dict[str, int]) -> None:
        self.map = Mapping(layout["size"], fd=ring_fd, offset=u.IORING_OFF_SQ_RING)
        self.u32 = self.map.view(np.uint32, 0, layout["size"] // 4)
        self.head_i, self.tail_i = layout["head"] // 4, layout["tail"] // 4
        self.entries = layout["entries"]
        words = layout["cqe"] // 8
        cqes = self.map.view(np.uint64, layout["cqes"], self.entries * words)
        self.u64 = cqes.reshape(self.entries, words)
        self.w32 = self.u64.view(np.uint32)

    def post(self, user_data: int, res: int, flags: np.ndarray,
             extra: np.ndarray | None = None) -> None:
        n = len(flags)
        tail = int(self.u32[self.tail_i])
        if self.entries - ((tail - int(self.u32[self.head_i])) & 0xFFFFFFFF) < n:
            raise RuntimeError("replay would overflow the CQ: the consumer fell behind")
        pos = (tail + np.arange(n)) % self.entries
        self.u64[pos, 0] = user_data
        self.w32[pos, 2] = res
        self.w32[pos, 3] = flags
        if extra is not None:
            self.u64[pos, 2] = extra
            self.u64[pos, 3] = 0
        self.u32[self.tail_i] = (tail + n) & 0xFFFFFFFF

    def close(self) -> None:
        self.map.close()


class StandIn:
    """The kernel's side of a replay: ``feed`` posts one round, its CPU time kept apart (in
    ``cpu``) so it can be subtracted from the application's."""

    cq: CqWriter

    def __init__(self, batch: int, chunk: int) -> None:
        self.batch, self.chunk = batch, chunk
        self.cpu = 0.0

    def feed(self) -> None:
        t0 = time.thread_time()
        self.post_round()
        self.cpu += time.thread_time() - t0

    def post_round(self) -> None:
        raise NotImplementedError


class Replayed:
    """Mixed into a real provider: arming is left out (the replayed CQEs stand for one armed
    multishot receive; the receiver's core counts it armed), every reap first lets the
    stand-in post a round, and close has nothing armed in the kernel to cancel."""

    kernel: StandIn

    def arm(self) -> None:
        pass

    def reap(self, timeout: float | None) -> Delivery:
        self.kernel.feed()
        return super().reap(timeout)  # type: ignore[misc, no-any-return]

    def quiesce(self, armed: bool) -> bool:
        return True  # nothing armed in the kernel to cancel (the soft one would wait for it)

    def close(self, armed: bool = False) -> bool:
        self.kernel.cq.close()
        return super().close(False)  # type: ignore[misc, no-any-return]


class SoftKernel(StandIn):
    """The kernel's side of a multishot RECV on a provided-buffer ring: each round takes the
    next ``batch`` buffers the application published (ring order, from the kernel's head up to
    the tail in entry 0) and posts one full-buffer CQE for each."""

    def __init__(self, prov: soft.SoftProvider, batch: int, chunk: int) -> None:
        super().__init__(batch, chunk)
        ring = prov.ring  # the provider's own ring: the kernel side writes into it
        assert ring is not None
        self.cq = CqWriter(ring.fd, cq_layout(64, soft.RING_FLAGS, ring.cq_entries))
        mem = prov.buf._mem  # the registered buffer ring, as the kernel reads it
        entries = prov.buf.entries
        self.mask = entries - 1
        self.tail16 = mem.view(np.uint16, 0, 8)  # entry 0's resv is the tail
        self.bids = mem.view(np.uint16, 0, entries * 8).reshape(entries, 8)[:, 6]
        self.head = 0

    def post_round(self) -> None:
        avail = (int(self.tail16[7]) - self.head) & 0xFFFF
        n = min(self.batch, avail)
        if n == 0:
            raise RuntimeError("replay: the application returned no buffers")
        bids = self.bids[(self.head + np.arange(n)) & self.mask].astype(np.uint32)
        self.head = (self.head + n) & 0xFFFF
        flags = (bids << u.IORING_CQE_BUFFER_SHIFT) | u.IORING_CQE_F_BUFFER | u.IORING_CQE_F_MORE
        self.cq.post(soft.RECV_UD, self.chunk, flags)


class ReplaySoft(Replayed, soft.SoftProvider):
    """The real soft provider, fed by SoftKernel."""

    def __init__(self, area: Area, chunk: int, batch: int) -> None:
        super().__init__(-1, area, chunk, bundle=False)
        self.kernel = SoftKernel(self, batch, chunk)


# zcrx refill region as the kernel lays it out: u32 head and u32 tail on their own 64-byte
# cache lines, then rq_entries io_uring_zcrx_rqe {u64 off; u32 len; u32 pad}.
RQ_HEAD, RQ_TAIL, RQ_RQES = 0, 64, 128


class ZcrxNic(StandIn):
    """The kernel's and the NIC's side of zcrx: registration fills in what the kernel returns
    (refill ring offsets, area token, ifq id), then each round hands out pages of the area as
    CQE32s and takes back the pages the application put on the refill ring, as NAPI does."""

    def __init__(self, batch: int, chunk: int) -> None:
        super().__init__(batch, chunk)
        self.reg: Any = None
        self.ring_fd = -1

    def register(self, ring: Ring, reg: Any, *, ifname: str = "?") -> None:
        """Stands in for IORING_REGISTER_ZCRX_IFQ (no NIC here supports it)."""
        if reg.region_mem is None:
            raise RuntimeError("the replay needs the refill ring in user memory")
        reg.ifq.offsets.head, reg.ifq.offsets.tail = RQ_HEAD, RQ_TAIL
        reg.ifq.offsets.rqes = RQ_RQES
        reg.area.rq_area_token = 0  # area id 0 << IORING_ZCRX_AREA_SHIFT
        reg.ifq.zcrx_id = 0
        self.reg, self.ring_fd = reg, ring.fd

    def start(self, area_size: int, cq_entries: int) -> None:
        entries = int(self.reg.ifq.rq_entries)
        mem = self.reg.region_mem.view(np.uint8)
        self.rq_mask = entries - 1
        self.khead = mem[RQ_HEAD:RQ_HEAD + 4].view(np.uint32)
        self.ktail = mem[RQ_TAIL:RQ_TAIL + 4].view(np.uint32)
        self.rqe_off = mem[RQ_RQES:RQ_RQES + entries * 16].view(np.uint64)[::2]
        self.cq = CqWriter(self.ring_fd, cq_layout(64, zcrx.RING_FLAGS, cq_entries))
        self.free = np.arange(area_size // self.chunk, dtype=np.uint64) * np.uint64(self.chunk)
        self.nfree = len(self.free)

    def post_round(self) -> None:
        # NAPI: take back what the application returned through the refill ring ...
        h, t = int(self.khead[0]), int(self.ktail[0])
        n = (t - h) & 0xFFFFFFFF
        if n:
            offs = self.rqe_off[(h + np.arange(n)) & self.rq_mask] & np.uint64(zcrx.OFF_MASK)
            self.free[self.nfree:self.nfree + n] = offs
            self.nfree += n
            self.khead[0] = t
        # ... and fill pages from the free pool.
        m = min(self.batch, self.nfree)
        if m == 0:
            raise RuntimeError("replay: the application returned no pages")
        offs = self.free[self.nfree - m:self.nfree].copy()
        self.nfree -= m
        self.cq.post(zcrx.RECV_UD, self.chunk, np.full(m, u.IORING_CQE_F_MORE, np.uint32), offs)


class ReplayZcrx(Replayed, zcrx.ZcrxProvider):
    """The real ZcrxProvider, built through its public constructor; only the kernel's
    registration step is played by ZcrxNic (as tests/closed_cases.py does)."""

    def __init__(self, area: Area, chunk: int, batch: int, rq_entries: int = 4096) -> None:
        self.kernel: ZcrxNic = ZcrxNic(batch, chunk)
        real, zcrx_queue.register_ifq = zcrx_queue.register_ifq, self.kernel.register
        try:
            super().__init__(-1, area, "lo", 0, rq_entries=rq_entries)
        finally:
            zcrx_queue.register_ifq = real
        assert self.ring is not None
        self.kernel.start(area.size, self.ring.cq_entries)


# --- the application's side ----------------------------------------------------------------------


def consume(rx: Receiver, mode: str, chunks: int) -> int:
    got = 0
    if mode == "recv_batch":
        while got < chunks:
            b = rx.recv_batch()
            assert b is not None
            got += b.parts
            b.release()
    elif mode == "iterator":
        for c in rx:
            c.release()
            got += 1
            if got >= chunks:
                break
    else:
        while got < chunks:
            cs = rx.recv()
            rx.release_many(cs)
            got += len(cs)
    return got


def zcrx_unavailable() -> str | None:
    """Why the zcrx provider cannot be built here even with registration played (say a
    changed constructor, or RLIMIT_MEMLOCK), or None."""
    area = Area(1 << 20)
    try:
        ReplayZcrx(area, 4096, 16, rq_entries=64).close()
    except (ZcnetError, OSError, TypeError, AttributeError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        area.close()
    return None


def run_python(kind: str, mode: str, chunk: int, batch: int, chunks: int) -> dict[str, float]:
    entries = 1 << max(batch * 4, 64).bit_length() - 1
    area = Area(entries * chunk)
    try:
        prov: Any = (ReplaySoft(area, chunk, batch) if kind == "soft"
                     else ReplayZcrx(area, chunk, batch))
    except BaseException:
        area.close()
        raise
    feeder = prov.kernel
    try:
        with Receiver(-1, prov) as rx:
            consume(rx, mode, batch * 8)  # warm up
            feeder.cpu = 0.0
            c0, w0 = time.thread_time(), time.perf_counter()
            got = consume(rx, mode, chunks)
            cpu = time.thread_time() - c0 - feeder.cpu
            wall = time.perf_counter() - w0 - feeder.cpu
    finally:
        area.close()
    return {"ns_chunk": cpu / got * 1e9, "wall_ns_chunk": wall / got * 1e9}


# --- the C baseline ------------------------------------------------------------------------------

C_SOURCE = r"""
/* The same completion walk and refill as the Python path, on memory laid out like the kernel's:
   16-byte CQEs + provided-buffer ring entries (soft), or 32-byte CQEs + refill-ring entries
   (zcrx). Prints user CPU ns per chunk of the consumer side only. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct cqe { uint64_t user_data; int32_t res; uint32_t flags; uint64_t big[2]; };
struct buf { uint64_t addr; uint32_t len; uint16_t bid; uint16_t resv; };
struct rqe { uint64_t off; uint32_t len; uint32_t pad; };

static double cpu(void) {
    struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int zc = !strcmp(argv[1], "zcrx");
    unsigned chunk = atoi(argv[2]), batch = atoi(argv[3]);
    unsigned long total = atol(argv[4]);
    unsigned entries = 1; while (entries * 2 <= (batch * 4 > 64 ? batch * 4 : 64)) entries *= 2;
    unsigned cq_entries = zc ? 8192 : 2 * entries, cqsz = zc ? 32 : 16, mask = entries - 1;
    char *cqmem = calloc(cq_entries, cqsz);
    volatile uint32_t cq_head = 0, cq_tail = 0;
    struct buf *br = calloc(entries, sizeof *br);
    struct rqe *rq = calloc(4096, sizeof *rq);
    volatile uint32_t rq_head = 0, rq_tail = 0;
    uint16_t *shadow = calloc(entries, 2);
    uint64_t *offs = malloc(8 * batch), *toks = malloc(8 * batch);
    uint64_t *free_pages = malloc(8 * entries), mask48 = (1ull << 48) - 1;
    uint32_t *lens = malloc(4 * batch);
    uint64_t base = (uint64_t)(uintptr_t)malloc(1), sum = 0;
    unsigned nfree = entries, khead = 0, bhead = 0; uint16_t btail = 0;
    for (unsigned i = 0; i < entries; i++) {
        free_pages[i] = (uint64_t)i * chunk;
        br[i].addr = base + (uint64_t)i * chunk; br[i].len = chunk; br[i].bid = i; shadow[i] = i;
    }
    btail = entries; br[0].resv = btail;
    double inject = 0, t0 = cpu();
    unsigned long done = 0;
    while (done < total) {
        double a = cpu();                                   /* the kernel's side, not counted */
        if (zc) {
            for (uint32_t h = rq_head; h != rq_tail; h++)
                free_pages[nfree++] = rq[h & 4095].off & mask48;
            rq_head = rq_tail;
            for (unsigned i = 0; i < batch; i++) {
                struct cqe *c = (struct cqe *)(cqmem + ((cq_tail + i) & (cq_entries - 1)) * cqsz);
                c->user_data = 1; c->res = chunk; c->flags = 2; c->big[0] = free_pages[--nfree];
            }
        } else {
            for (unsigned i = 0; i < batch; i++, khead++) {
                struct cqe *c = (struct cqe *)(cqmem + ((cq_tail + i) & (cq_entries - 1)) * cqsz);
                c->user_data = 1; c->res = chunk;
                c->flags = 3 | (uint32_t)br[khead & mask].bid << 16;
            }
        }
        __atomic_store_n(&cq_tail, cq_tail + batch, __ATOMIC_RELEASE);
        inject += cpu() - a;
        /* the application's side: walk the CQEs into a batch of (offset, length, token) */
        uint32_t h = cq_head, t = __atomic_load_n(&cq_tail, __ATOMIC_ACQUIRE), n = 0;
        for (; h != t; h++, n++) {
            struct cqe *c = (struct cqe *)(cqmem + (h & (cq_entries - 1)) * cqsz);
            if (c->user_data != 1 || c->res <= 0 || !(c->flags & 2)) {
                fprintf(stderr, "bad cqe\n"); return 1;
            }
            if (zc) { toks[n] = c->big[0]; offs[n] = c->big[0] & mask48; }
            else {
                uint16_t bid = c->flags >> 16;
                if (shadow[bhead++ & mask] != bid) { fprintf(stderr, "out of step\n"); return 1; }
                toks[n] = bid; offs[n] = (uint64_t)bid * chunk;
            }
            lens[n] = c->res;
        }
        __atomic_store_n(&cq_head, h, __ATOMIC_RELEASE);
        for (uint32_t i = 0; i < n; i++) sum += offs[i] + lens[i];
        /* release the batch: refill ring or buffer ring, then the tail store */
        if (zc) {
            uint32_t rt = rq_tail;
            for (uint32_t i = 0; i < n; i++, rt++) {
                struct rqe *e = &rq[rt & 4095];
                e->off = toks[i]; e->len = lens[i]; e->pad = 0;
            }
            __atomic_store_n(&rq_tail, rt, __ATOMIC_RELEASE);
        } else {
            for (uint32_t i = 0; i < n; i++, btail++) {
                struct buf *b = &br[btail & mask];
                b->addr = base + toks[i] * chunk; b->len = chunk; b->bid = toks[i];
                shadow[btail & mask] = toks[i];
            }
            __atomic_store_n(&br[0].resv, btail, __ATOMIC_RELEASE);
        }
        done += n;
    }
    double c = cpu() - t0 - inject;
    printf("%.3f %llu\n", c / done * 1e9, (unsigned long long)(sum & 1));
    return 0;
}
"""


def run_c(exe: str, kind: str, chunk: int, batch: int, chunks: int) -> float:
    out = subprocess.run([exe, kind, str(chunk), str(batch), str(chunks * 10)],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=400_000, help="chunks per measurement")
    ap.add_argument("--batch", type=int, default=256, help="CQEs the kernel posts per round")
    ap.add_argument("--sizes", default="4,16,64", help="chunk sizes in KiB")
    ap.add_argument("--kinds", default="soft,zcrx")
    ap.add_argument("--repeat", type=int, default=3, help="best of N (shared machine)")
    args = ap.parse_args()
    sizes = [int(s) << 10 for s in args.sizes.split(",")]
    kinds = args.kinds.split(",")
    print(f"replay: {args.chunks} chunks per cell, {args.batch} CQEs per round, best of "
          f"{args.repeat}; python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"ring hot path {backend()}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("user CPU of the application's side only; chunks/s = what one core reaches at it")
    targets: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        exe, note = compile_c(C_SOURCE, tmp, "replay", "C baseline")
        print(note)
        print(f"{'provider':<6} {'chunk':>6} {'mode':<13} {'ns/chunk':>9} {'M chunks/s':>11} "
              f"{'ms/GiB':>8} {'C ns/chunk':>11} {'C/py':>6}")
        for kind in kinds:
            if kind == "zcrx" and (why := zcrx_unavailable()):
                print(f"zcrx replay skipped: {why}")
                continue
            for chunk in sizes:
                c_ns = None
                if exe:
                    c_ns = min(run_c(exe, kind, chunk, args.batch, args.chunks)
                               for _ in range(args.repeat))
                for mode in MODES:
                    best = min((run_python(kind, mode, chunk, args.batch, args.chunks)
                                for _ in range(args.repeat)), key=lambda r: r["ns_chunk"])
                    ns = best["ns_chunk"]
                    ms_gib = ns * (GIB / chunk) / 1e6
                    ratio = f"{c_ns / ns:6.3f}" if c_ns else "   n/a"
                    c_txt = f"{c_ns:11.1f}" if c_ns else f"{'n/a':>11}"
                    print(f"{kind:<6} {chunk >> 10:>4}Ki {mode:<13} {ns:9.1f} "
                          f"{1e3 / ns:11.2f} {ms_gib:8.2f} {c_txt} {ratio}", flush=True)
                    if chunk == 4096:
                        targets[f"{kind}_{mode}_4k"] = 1e3 / ns
                        if mode == "recv_batch":
                            targets[f"{kind}_recv_batch_4k_ms_per_gib"] = ms_gib
                            if c_ns:
                                targets[f"{kind}_recv_batch_4k_vs_c"] = c_ns / ns
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for kind in kinds:
        for name, goal, unit in ((f"{kind}_recv_batch_4k", ">= 20", "M_chunks/s"),
                                 (f"{kind}_recv_batch_4k_ms_per_gib", "<= 15", "ms/GiB"),
                                 (f"{kind}_iterator_4k", ">= 3", "M_chunks/s"),
                                 (f"{kind}_recv_batch_4k_vs_c", "report", "x")):
            if name in targets:
                print(f"target {name} {targets[name]:.3f} {unit} goal {goal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
