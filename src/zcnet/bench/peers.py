"""The C peers (iperf3, sockperf) run in the same lab, placement and duration as zcnet's engines.

A peer's result is a bench cell's row (``engine``, ``status``, ``gbps``, ``cpu`` ...) with
``peer``, so tables and ``compare`` treat it like any other column. The server runs in the
receiving namespace, the client in the sending one, each pinned with taskset to the CPU the
placement gives it; CPU shares come from /proc/stat over the client's run, as for the engines.

Some facts about the peers: ``iperf3 -J`` exits 0 even when it could not connect, reporting the
failure in the JSON ``error`` field, so success is read from the JSON, not the exit status. A client
started before its server listens gets ECONNREFUSED; the client is retried for a short while
rather than sleeping a guessed time. sockperf prints its summary on stdout with ANSI colour codes.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from zcnet.bench.cpustat import CpuTimes
from zcnet.bench.records import CpuPair, ResultRow
from zcnet.errors import UsageError

log = logging.getLogger(__name__)

CONNECT_RETRY_S = 3.0
IPERF3_PORT = 5201
SOCKPERF_PORT = 11111


class LabLike(Protocol):
    ns_a: str
    ns_b: str
    addr_b: str


class PeerRun(Protocol):
    """One run of a peer tool: the figures it measured (a row without the cell's fields)."""

    def __call__(self, lab: LabLike, *, rx_cpu: int, tx_cpu: int, duration: float,
                 length: int | None = None) -> ResultRow: ...


@dataclass(frozen=True)
class PeerTool:
    name: str
    binary: str
    install: str
    run: PeerRun


class PeerFailed(Exception):
    """One peer run failed; becomes an ``error`` cell, never a crash of the whole run."""


def netns_argv(ns: str, cpu: int, argv: list[str]) -> list[str]:
    """``argv`` run in namespace ``ns`` pinned to ``cpu`` (how every peer in the lab runs)."""
    return ["ip", "netns", "exec", ns, "taskset", "-c", str(cpu), *argv]


def _stop(proc: subprocess.Popen[str]) -> str:
    """End a server we started and return its output; always reaps it."""
    try:
        out, _ = proc.communicate(timeout=2)
        return out or ""
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        return out or ""


def _client(argv: list[str], timeout: float, refused: Callable[[str], bool]) -> str:
    deadline = time.monotonic() + CONNECT_RETRY_S
    while True:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise PeerFailed(f"client did not finish within {timeout:.0f} s") from None
        if not refused(r.stdout + r.stderr) or time.monotonic() > deadline:
            return r.stdout + ("\n" + r.stderr if r.returncode else "")
        time.sleep(0.05)


def _cpu(before: CpuTimes, rx_cpu: int, tx_cpu: int) -> CpuPair:
    """Each side's shares; None for a CPU that was not sampled (n/a, never 0%)."""
    shares = CpuTimes.read().since(before)
    rx, tx = shares.get(rx_cpu), shares.get(tx_cpu)
    return CpuPair(rx=rx if rx is not None and rx.sampled else None,
                   tx=tx if tx is not None and tx.sampled else None)


def _iperf3(lab: LabLike, *, rx_cpu: int, tx_cpu: int, duration: float,
            length: int | None = None) -> ResultRow:
    server = subprocess.Popen(
        netns_argv(lab.ns_b, rx_cpu, ["iperf3", "-s", "-1", "-J", "-B", lab.addr_b,
                                       "-p", str(IPERF3_PORT)]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # iperf3 reads -t as whole seconds, and 0 means "forever": never pass it a fraction.
        seconds = max(1, math.ceil(duration))
        argv = ["iperf3", "-c", lab.addr_b, "-p", str(IPERF3_PORT), "-t", str(seconds), "-J"]
        if length:
            argv += ["-l", str(length)]
        before = CpuTimes.read()
        out = _client(netns_argv(lab.ns_a, tx_cpu, argv), duration + 15,
                      lambda text: "Connection refused" in text)
        cpu = _cpu(before, rx_cpu, tx_cpu)
    finally:
        _stop(server)
    try:
        doc = json.loads(out[: out.rfind("}") + 1] or "{}")
    except json.JSONDecodeError:
        raise PeerFailed(f"unreadable iperf3 output: {out[:200]!r}") from None
    if doc.get("error"):
        raise PeerFailed(f"iperf3: {doc['error']}")
    recv = (doc.get("end") or {}).get("sum_received") or {}
    if not recv.get("seconds"):
        raise PeerFailed("iperf3 reported no received data")
    return ResultRow(bytes=int(recv["bytes"]), seconds=float(recv["seconds"]),
                     gbps=float(recv["bits_per_second"]) / 1e9, cpu=cpu)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SP_LAT = re.compile(r"avg-latency=([0-9.]+) \(std-dev=([0-9.]+)\)")
_SP_BW = re.compile(r"BandWidth is [0-9.]+ MBps \(([0-9.]+) Mbps\)")
_SP_PCT = re.compile(r"percentile (\d+\.\d+) =\s+([0-9.]+)")


def _sockperf(lab: LabLike, *, rx_cpu: int, tx_cpu: int, duration: float,
              length: int | None = None) -> ResultRow:
    """TCP one-way throughput for ``duration``, then ping-pong latency for ``duration``."""
    server = subprocess.Popen(
        netns_argv(lab.ns_b, rx_cpu, ["sockperf", "sr", "--tcp", "-i", lab.addr_b,
                                       "-p", str(SOCKPERF_PORT)]),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # sockperf's -t is whole seconds too.
    common = ["--tcp", "-i", lab.addr_b, "-p", str(SOCKPERF_PORT), "-t",
              str(max(1, math.ceil(duration)))]

    def refused(text: str) -> bool:
        return "Connection refused" in text or "ERROR" in text

    try:
        before = CpuTimes.read()
        tp = _ANSI.sub("", _client(
            netns_argv(lab.ns_a, tx_cpu, ["sockperf", "tp", "-m", str(length or 65000), *common]),
            duration + 15, refused))
        cpu = _cpu(before, rx_cpu, tx_cpu)
        pp = _ANSI.sub("", _client(netns_argv(lab.ns_a, tx_cpu, ["sockperf", "pp", *common]),
                                   duration + 15, refused))
    finally:
        server.terminate()
        _stop(server)
    bw, lat = _SP_BW.search(tp), _SP_LAT.search(pp)
    if not bw or not lat:
        last = (tp + pp).strip().splitlines()[-1:] or ["(nothing)"]
        raise PeerFailed(f"sockperf printed no summary: {last[0][:200]}")
    pct = {p: float(v) for p, v in _SP_PCT.findall(pp)}
    return ResultRow(seconds=float(duration), gbps=float(bw.group(1)) / 1000, cpu=cpu,
                     latency_us=float(lat.group(1)), latency_stdev_us=float(lat.group(2)),
                     latency_p99_us=pct.get("99.000"))


PEERS: dict[str, PeerTool] = {t.name: t for t in (
    PeerTool("iperf3", "iperf3", "apt-get install iperf3", _iperf3),
    PeerTool("sockperf", "sockperf", "apt-get install sockperf", _sockperf),
)}


def parse_peers(text: str) -> list[str]:
    """``"iperf3,sockperf"`` -> names; unknown names are a usage error listing the valid ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in PEERS:
            raise UsageError(f"unknown peer {n!r}", "choose from: " + ", ".join(PEERS))
    return names


def run_peer(name: str, lab: LabLike, *, rx_cpu: int, tx_cpu: int, duration: float,
             mtu: int | None = None, placement: str | None = None,
             length: int | None = None) -> ResultRow:
    """Run one peer tool once, pinned to ``rx_cpu`` and ``tx_cpu``; a bench cell's row
    whatever happens."""
    tool = PEERS.get(name)
    if tool is None:
        raise UsageError(f"unknown peer {name!r}", "choose from: " + ", ".join(PEERS))
    row = ResultRow(engine=name, peer=name, mtu=mtu, placement=placement, rx_app_cpu=rx_cpu,
                    tx_app_cpu=tx_cpu)
    if shutil.which(tool.binary) is None:
        row.status, row.reason = "unsupported", f"not installed ({tool.install})"
        return row
    try:
        figures = tool.run(lab, rx_cpu=rx_cpu, tx_cpu=tx_cpu, duration=duration, length=length)
    except (PeerFailed, OSError) as exc:
        log.warning("peer %s failed: %s", name, exc)
        row.status, row.reason = "error", str(exc)
        return row
    return replace(figures, engine=name, peer=name, mtu=mtu, placement=placement,
                   rx_app_cpu=rx_cpu, tx_app_cpu=tx_cpu)
