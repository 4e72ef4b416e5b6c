"""TCP send paths (copy, msgzc, sendzc, sendzc-plain) on loopback, against iperf3 in the same run.

    python benchmarks/tx_senders.py [--seconds 2] [--chunk 65536]

The receiver is a separate process draining with recv_into, so the sender owns its CPU. On
loopback every zero-copy send is copied by the kernel after all (the counts show it), so this
measures the bookkeeping cost of each path, not a zero-copy gain. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import time

from zcnet.tx.senders import KINDS, make_sender
from zcnet.tx.sendzc import send_buffer

_DRAIN = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); n = 0
while (k := c.recv_into(buf)): n += k
print(n, flush=True)
"""


def run_kind(kind: str, seconds: float, chunk: int, slots: int) -> dict[str, float | int | str]:
    drain = subprocess.Popen([sys.executable, "-c", _DRAIN], stdout=subprocess.PIPE, text=True)
    try:
        assert drain.stdout is not None
        port = int(drain.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sender = make_sender(kind, sock, send_buffer(chunk * slots), slots=slots)
            sent = 0
            cpu0, t0 = time.thread_time(), time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                sent += sender.send(chunk)
            sender.flush()
            wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
            stats = sender.stats()
            sender.close()
        received = int(drain.stdout.readline())
    finally:
        drain.wait(timeout=10)
    return {"kind": kind, "gbps": sent * 8 / wall / 1e9, "cpu": cpu / wall,
            "zerocopy": stats.zerocopy, "copied": stats.copied, "sends": stats.sends,
            "ok": received == sent, "note": stats.note}


def iperf3_gbps(seconds: float, chunk: int) -> float | None:
    if shutil.which("iperf3") is None:
        return None
    server = subprocess.Popen(["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", "5298"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", "5298", "-l", str(chunk),
                              "-t", str(max(1, round(seconds))), "-J"],
                             capture_output=True, text=True, timeout=seconds + 20).stdout
    finally:
        server.wait(timeout=10)
    try:
        return json.loads(out)["end"]["sum_sent"]["bits_per_second"] / 1e9
    except (ValueError, KeyError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--chunk", type=int, default=65536)
    ap.add_argument("--slots", type=int, default=32, help="buffer slots per zero-copy sender")
    args = ap.parse_args()
    peer = iperf3_gbps(args.seconds, args.chunk)
    print(f"TCP loopback, {args.chunk} B per send, {args.seconds} s per kind")
    print(f"{'kind':13} {'Gbit/s':>7} {'vs iperf3':>9} {'CPU':>5} {'zerocopy':>9} {'copied':>8}")
    for kind in (k for k in KINDS if k != "devmem"):  # devmem needs netmem TX, not lo
        r = run_kind(kind, args.seconds, args.chunk, args.slots)
        vs = f"{r['gbps'] / peer:.2f}x" if peer else "-"
        print(f"{kind:13} {r['gbps']:7.2f} {vs:>9} {r['cpu']:5.0%} {r['zerocopy']:>9} "
              f"{r['copied']:>8}{'' if r['ok'] else '  LOST BYTES'} {r['note']}")
    if peer:
        print(f"{'iperf3':13} {peer:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
