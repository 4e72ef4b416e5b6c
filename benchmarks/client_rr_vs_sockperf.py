"""Request/response p50 through zcnet server + client vs sockperf ping-pong, same run, loopback.

Target (issue 6): zcnet RR p50 <= 1.2x sockperf's p50. Both measure full round trips of
``--size``-byte messages over one TCP connection on 127.0.0.1 (sockperf with --full-rtt, since it
prints half round trips by default). Rounds alternate sockperf / zcnet, swapping which goes
first, so that drift on this shared machine hits both; medians over rounds are compared.

    python benchmarks/client_rr_vs_sockperf.py [--rounds 3] [--duration 3] [--size 64]
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import subprocess
import sys
import time

from zcnet.bench.client import ClientOptions, run

PCT = re.compile(r"percentile 50\.000 =\s+([0-9.]+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sockperf_p50(duration: float, size: int) -> float:
    port = free_port()
    srv = subprocess.Popen(["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # until the server listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except ConnectionRefusedError:
                time.sleep(0.05)
        out = subprocess.run(["sockperf", "pp", "--tcp", "--full-rtt", "-i", "127.0.0.1", "-p",
                              str(port), "-m", str(size), "-t", f"{duration:g}"],
                             capture_output=True, text=True, timeout=duration + 30).stdout
    finally:
        srv.terminate()
        srv.wait()
    m = PCT.search(re.sub(r"\x1b\[[0-9;]*m", "", out))
    if not m:
        sys.exit(f"no p50 in sockperf output:\n{out}")
    return float(m.group(1))


def zcnet_p50(address: str, duration: float, size: int) -> tuple[float, float]:
    res = run(ClientOptions(src=address, dst=address, mode="rr", duration=duration,
                            req_size=size, resp_size=size))
    lat = res.summary.latency
    if lat is None or lat.p50_us is None or res.summary.tps is None:
        sys.exit(f"no latency measured: {res.flows[0].reason}")
    return lat.p50_us, res.summary.tps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "zcnet", "server", "--listen",
                               "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        address = server.stdout.readline().rsplit(" ", 1)[1].strip()
        sp, zc = [], []
        for r in range(a.rounds):
            # Alternate which goes first, so that neither always inherits the other's state.
            if r % 2:
                p50, tps = zcnet_p50(address, a.duration, a.size)
                sp.append(sockperf_p50(a.duration, a.size))
            else:
                sp.append(sockperf_p50(a.duration, a.size))
                p50, tps = zcnet_p50(address, a.duration, a.size)
            zc.append(p50)
            print(f"round {r + 1}: sockperf p50 {sp[-1]:.2f} us   zcnet p50 {p50:.2f} us "
                  f"({tps:.0f} tps)")
    finally:
        server.terminate()
        server.wait()
    s, z = statistics.median(sp), statistics.median(zc)
    ratio = z / s
    print(f"median p50 (full RTT, {a.size} B): sockperf {s:.2f} us, zcnet {z:.2f} us, "
          f"ratio {ratio:.2f}x (target <= 1.20x: {'met' if ratio <= 1.2 else 'NOT met'})")


if __name__ == "__main__":
    main()
