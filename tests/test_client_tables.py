"""`zcnet client`'s tables: a failed flow's figures read n/a (never 0), the summary says n/a for
a latency it lacks, and the per-CPU table shows the shares that were spent."""

from __future__ import annotations

from zcnet.bench.client import ClientResult
from zcnet.bench.records import ClientSummary, Latency, ResultRow, RoleShares, TcpDelta
from zcnet.cli.client import tables
from zcnet.report.export import to_text

SHARES = {"usr": 40.0, "nice": 0.0, "sys": 30.0, "iowait": 0.0, "irq": 0.0, "soft": 20.0,
          "steal": 2.5, "guest": 0.0, "idle": 7.5, "busy": 92.5}


def _flow(flow: int, status: str, tps: float, latency: Latency | None = None,
          reason: str = "") -> ResultRow:
    return ResultRow(flow=flow, status=status, rx_cpu=0, rx_app_cpu=None, tx_cpu=1, tx_app_cpu=1,
                     tcp_tx=TcpDelta(retrans=0, rtt_us=40, snd_cwnd=10), tps=tps,
                     latency=latency, reason=reason)


def test_failed_flow_is_na_and_missing_latency_is_na() -> None:
    flows = [_flow(0, "ok", 1234.0, Latency(p50_us=6.0, p90_us=7.0, p99_us=9.0, p99_9_us=20.0)),
             _flow(1, "error", 0.0, reason="rx worker died")]
    result = ClientResult(flows, ClientSummary(mode="rr", flows=2, ok=1, tps=1234.0),
                          {"host": {"0": RoleShares(**SHARES, roles=["rx-softirq"]),
                                    "1": RoleShares()}}, {})
    flow_table, cpu_table = tables(result)
    assert flow_table.rows[0][6] == "1234"  # transactions per second: a whole number
    assert flow_table.rows[1][6:11] == ["n/a"] * 5  # not 0.00 for a flow that failed
    assert flow_table.notes[0] == "total 1234 tps, p50 n/a, p99 n/a over 1/2 flows"
    assert cpu_table.headers == ["side", "cpu", "roles", "%usr", "%sys", "%iowait", "%irq",
                                 "%soft", "%steal", "%idle"]
    assert cpu_table.rows[0][3:] == ["40.00", "30.00", "0.00", "0.00", "20.00", "2.50", "7.50"]
    assert cpu_table.rows[1][3:] == ["n/a"] * 7  # CPU 1 counted no tick: unknown, not idle
    assert "%nice, %guest: 0 on every CPU, not shown" in cpu_table.notes[0]
    text = to_text([flow_table, cpu_table], width=80)
    assert "0.00 " not in text.split("per-CPU")[0]
