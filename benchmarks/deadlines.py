"""How promptly the bounded waits end: the speed side of claims the tests check only for
correctness (the tests catch a wait that never ends; this measures how late it ends).

- ring wait(timeout 0.2 s) under a 20 ms stream of signals (a profiler's timer): elapsed;
- SendZcSender.flush(timeout 0.3 s) on a peer that stopped reading: elapsed and process CPU
  (a flush that spins instead of sleeping in the kernel burns the whole 0.3 s);
- the same flush's peer: a plain blocking recv with the same timeout, for comparison.

Usage: python benchmarks/deadlines.py [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import statistics
import time

from zcnet.errors import ZcnetError
from zcnet.tx.sendzc import SendZcSender
from zcnet.uapi import io_uring as u
from zcnet.uring.mem import Mapping
from zcnet.uring.prep import prep_recv
from zcnet.uring.ring import Ring

FAST = u.IORING_SETUP_SINGLE_ISSUER | u.IORING_SETUP_DEFER_TASKRUN


class _Interrupted(Exception):
    pass


def _interrupt(_sig: int, _frame: object) -> None:
    raise _Interrupted


def pair(small: bool = False) -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as ls:
        c = socket.socket()
        if small:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        c.connect(ls.getsockname())
        s, _ = ls.accept()
    if small:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return c, s


def ring_wait_under_signals() -> float:
    c, s = pair()
    old = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        with Ring(4, flags=FAST) as r, Mapping.anonymous(4096) as m:
            prep_recv(r, s.fileno(), m.addr, 16, user_data=1)
            r.submit()
            signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
            t0 = time.monotonic()
            r.wait(1, timeout=0.2)
            return time.monotonic() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        c.close()
        s.close()


def flush_on_stalled_peer() -> tuple[float, float]:
    c, s = pair(small=True)
    buf = bytearray(8 << 20)
    snd = SendZcSender(c, buf, slots=1)
    old = signal.signal(signal.SIGALRM, _interrupt)
    try:
        # The send cannot complete (nobody reads): interrupt it as Ctrl-C would.
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with contextlib.suppress(_Interrupted):
            snd.send(len(buf))
        signal.setitimer(signal.ITIMER_REAL, 0)
        t0, cpu0 = time.monotonic(), time.process_time()
        with contextlib.suppress(ZcnetError):
            snd.flush(timeout=0.3)
        return time.monotonic() - t0, time.process_time() - cpu0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        c.shutdown(socket.SHUT_RDWR)
        snd.close()
        c.close()
        s.close()


def blocking_recv_timeout() -> float:
    c, s = pair()
    try:
        s.settimeout(0.3)
        t0 = time.monotonic()
        with contextlib.suppress(TimeoutError):
            s.recv(16)
        return time.monotonic() - t0
    finally:
        c.close()
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    waits = [ring_wait_under_signals() for _ in range(args.rounds)]
    flushes = [flush_on_stalled_peer() for _ in range(args.rounds)]
    peers = [blocking_recv_timeout() for _ in range(args.rounds)]
    w = statistics.median(waits)
    fe = statistics.median(f[0] for f in flushes)
    fc = statistics.median(f[1] for f in flushes)
    pe = statistics.median(peers)
    print(f"ring wait 0.2 s under signals: median {w * 1e3:.0f} ms over {args.rounds} rounds")
    print(f"sendzc flush 0.3 s, stalled peer: median {fe * 1e3:.0f} ms elapsed, "
          f"{fc * 1e3:.1f} ms CPU")
    print(f"blocking recv, 0.3 s timeout (peer): median {pe * 1e3:.0f} ms; flush/peer "
          f"{fe / pe:.2f}x")
    print(f"target ring_wait_overrun {w - 0.2:.3f} s goal < 0.8")
    print(f"target flush_overrun {fe - 0.3:.3f} s goal < 1.7")
    print(f"target flush_cpu {fc:.4f} s goal < 0.1")


if __name__ == "__main__":
    main()
