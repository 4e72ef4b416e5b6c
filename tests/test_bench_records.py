"""Result records and their one JSON form: what is written, what is read back (types, ranges, the
path of the first bad value), files of format 1, and one name per field from a flow to a cell."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest

from report_docs import load
from zcnet.bench import proto
from zcnet.bench.client import ClientResult
from zcnet.bench.proto import RemoteProtocolError
from zcnet.bench.records import (
    FORMAT,
    ClientSummary,
    CpuPair,
    CpuShares,
    FlowEnd,
    Latency,
    RecordError,
    ResultRow,
    RoleShares,
    RunResults,
    TcpDelta,
    parse,
    read_file,
    to_json,
)
from zcnet.bench.run import flow_cell

FIXTURES = ("bench-a", "bench-b", "bench-other-host", "mlx5-zcrx", "tx-mpwqe", "zcrx-refs")


@pytest.mark.parametrize("name", FIXTURES)
def test_a_file_read_and_written_again_reads_the_same(name: str) -> None:
    doc = read_file(load(name))
    again = json.loads(json.dumps(to_json(doc)))
    assert again["format"] == FORMAT and read_file(again) == doc


def test_written_rows_leave_out_what_was_not_measured() -> None:
    row = ResultRow(engine="epoll", mtu=1500, gbps=1.5, cpu=CpuPair(rx=CpuShares(idle=10.0)),
                    latency=Latency(p50_us=3.0, p99_9_us=9.0))
    assert to_json(row) == {"engine": "epoll", "mtu": 1500, "status": "ok", "reason": "",
                            "gbps": 1.5, "p50_us": 3.0, "p99.9_us": 9.0,
                            "cpu": {"rx": {"idle": 10.0}, "tx": None}}
    back = parse(ResultRow, to_json(row))
    assert back == row and back.latency == Latency(p50_us=3.0, p99_9_us=9.0)


@pytest.mark.parametrize(("where", "value", "path", "why"), [
    ("gbps", -1.0, "results[0].gbps", "never negative"),
    ("gbps", True, "results[0].gbps", "must be a number"),
    ("gbps", "fast", "results[0].gbps", "must be a number"),
    ("mtu", 1500.0, "results[0].mtu", "must be a whole number"),
    ("mtu", 70000, "results[0].mtu", "68..65536"),
    ("status", "fine", "results[0].status", "is not one of: ok, error, unsupported"),
    ("cpus", {"zero": {}}, "results[0].cpus", "keys must be CPU numbers"),
    ("cpus", {"0": {"idle": 101}}, "results[0].cpus.0.idle", "0..100"),
    ("verify", {"mismatches": 0}, "results[0].verify.checked_bytes", "missing"),
    ("warnings", ["ok", 3], "results[0].warnings[1]", "must be text"),
])
def test_a_bad_value_is_named_by_its_path(where: str, value: Any, path: str, why: str) -> None:
    doc = copy.deepcopy(load("bench-a"))
    doc["results"][0][where] = value
    with pytest.raises(RecordError) as info:
        read_file(doc)
    assert info.value.path == path and why in info.value.why, str(info.value)


def test_numbers_a_float_cannot_hold_are_refused() -> None:
    doc = load("bench-a")
    for bad in (math.inf, math.nan, 10**400):
        doc["results"][0]["seconds"] = bad
        with pytest.raises(RecordError, match="finite"):
            read_file(doc)


def test_format_1_rows_are_read_under_the_names_of_format_2() -> None:
    """zcnet before format 2 named a bench cell's application CPUs rx_cpu/tx_cpu, its end CPU
    incoming_cpu, nested TCP_INFO under tcp, joined its warnings into warning; and a client
    flow's failure was error."""
    bench = {"tool": "zcnet", "kind": "bench", "results": [
        {"engine": "epoll", "mtu": 1500, "placement": "split", "status": "ok", "reason": "",
         "rx_cpu": 1, "tx_cpu": 0, "incoming_cpu": 0, "warning": "rate not steady: x",
         "tcp": {"tx": {"retrans": 2}, "rx": {"rcv_ooopack": 1}}}]}
    (row,) = read_file(bench).results
    assert (row.rx_app_cpu, row.tx_app_cpu, row.rx_cpu_end, row.rx_cpu) == (1, 0, 0, None)
    assert row.tcp_tx == TcpDelta(retrans=2) and row.tcp_rx == TcpDelta(rcv_ooopack=1)
    assert row.warnings == ["rate not steady: x"] and row.shares_cpu("rx") == 1
    client = {"tool": "zcnet", "kind": "client", "format": 1, "results": [
        {"flow": 0, "status": "error", "error": "rx worker died", "rx_cpu": 1},
        {"flow": 1, "status": "ok", "error": None, "rx_cpu": 0}]}
    died, ok = read_file(client).results
    assert (died.reason, died.rx_cpu, ok.reason) == ("rx worker died", 1, "")
    # A file of format 2 is read as it is: its rx_cpu is the softirq's.
    assert read_file({**bench, "format": 2}).results[0].rx_cpu == 1


def test_the_results_message_is_checked_as_the_client_reads_it() -> None:
    end = FlowEnd(flow=0, role="rx", bytes=10, seconds=0.5, syscalls=3, cpu_end=1,
                  tcp=TcpDelta(rtt_us=20))
    run = RunResults(flows=[end], seconds=0.5, cpus={"1": CpuShares(idle=50.0, busy=50.0)})
    msg = {"type": "results", **to_json(run)}  # type: ignore[dict-item]
    assert proto.validate(msg) == msg and parse(RunResults, msg) == run
    for bad in ({"role": "both"}, {"bytes": -1}, {"flow": "0"}):
        wire = {**msg, "flows": [{**to_json(end), **bad}]}  # type: ignore[dict-item]
        with pytest.raises(RemoteProtocolError, match=r"results\.flows"):
            proto.validate(wire)


def _client_result(flow: ResultRow, shares: CpuShares) -> ClientResult:
    both = RoleShares(**vars(shares))
    return ClientResult([flow], ClientSummary(flows=1, ok=1, mode="stream"),
                        {"dst": {"1": both}, "src": {"0": both}}, {})


def test_a_bench_cell_keeps_the_flows_fields_under_their_names() -> None:
    """Every field a client flow and the bench cell made of it both have holds the same value:
    no field is renamed on the way."""
    flow = ResultRow(flow=0, attempts=1, mode="stream", engine="epoll", tx="copy", rx_cpu=0,
                     tx_cpu=0, rx_app_cpu=1, tx_app_cpu=0, rx_cpu_end=0, tx_cpu_end=0,
                     bytes=10**9, bytes_sent=10**9, seconds=1.0, gbps=8.0, syscalls=40,
                     engine_stats={"rounds": 4}, tcp_tx=TcpDelta(retrans=1, rtt_us=30),
                     tcp_rx=TcpDelta(rcv_ooopack=0, rtt_us=31))
    shares = CpuShares(usr=10.0, sys=20.0, idle=70.0, busy=30.0)
    cell = flow_cell(_client_result(flow, shares), 1500, "epoll", "split", tx="copy",
                     consumer="same")
    flow_json, cell_json = to_json(flow), to_json(cell)
    assert isinstance(flow_json, dict) and isinstance(cell_json, dict)
    shared = set(flow_json) & set(cell_json)
    assert {"rx_cpu", "rx_app_cpu", "rx_cpu_end", "tcp_tx", "tcp_rx", "syscalls",
            "gbps"} <= shared
    assert {k: cell_json[k] for k in shared} == {k: flow_json[k] for k in shared}
    assert cell.cpu == CpuPair(rx=shares, tx=shares)
