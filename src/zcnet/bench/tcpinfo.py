"""TCP_INFO snapshots of one socket and the deltas a benchmark reports.

Counters (retransmits, bytes, segments, reordering events) are reported as the difference between
the snapshot at start and at end; gauges (rtt, cwnd, reordering degree, mss) as the end value,
since a difference of two gauge readings means nothing.
"""

from __future__ import annotations

import ctypes
import socket

from zcnet.bench.records import TcpDelta
from zcnet.uapi.tcp import SOL_TCP, TCP_INFO, tcp_info

# Reported name (a TcpDelta field) -> tcp_info field. Counters are differenced, gauges taken at
# the end.
COUNTERS: dict[str, str] = {
    "retrans": "tcpi_total_retrans",
    "bytes_retrans": "tcpi_bytes_retrans",
    "reord_seen": "tcpi_reord_seen",
    "dsack_dups": "tcpi_dsack_dups",
    "rcv_ooopack": "tcpi_rcv_ooopack",
    "segs_out": "tcpi_segs_out",
    "segs_in": "tcpi_segs_in",
    "bytes_acked": "tcpi_bytes_acked",
    "bytes_received": "tcpi_bytes_received",
    "bytes_sent": "tcpi_bytes_sent",
    "rwnd_limited_us": "tcpi_rwnd_limited",
    "sndbuf_limited_us": "tcpi_sndbuf_limited",
    "busy_time_us": "tcpi_busy_time",
}
GAUGES: dict[str, str] = {
    "rtt_us": "tcpi_rtt",
    "rttvar_us": "tcpi_rttvar",
    "min_rtt_us": "tcpi_min_rtt",
    "snd_cwnd": "tcpi_snd_cwnd",
    "reordering": "tcpi_reordering",
    "snd_mss": "tcpi_snd_mss",
    "rcv_mss": "tcpi_rcv_mss",
    "pmtu": "tcpi_pmtu",
}


def read(sock: socket.socket) -> dict[str, int]:
    """One TCP_INFO snapshot as {field: value}, fields the kernel did not fill left out."""
    raw = sock.getsockopt(SOL_TCP, TCP_INFO, ctypes.sizeof(tcp_info))
    info = tcp_info.from_buffer_copy(raw.ljust(ctypes.sizeof(tcp_info), b"\0"))
    out: dict[str, int] = {}
    for name, *_ in tcp_info._fields_:
        if getattr(tcp_info, name).offset < len(raw):
            out[name] = int(getattr(info, name))
    return out


def delta(before: dict[str, int], after: dict[str, int]) -> TcpDelta:
    """What happened on the connection between two snapshots (see module doc)."""
    out: dict[str, int] = {}
    for key, field in COUNTERS.items():
        if field in before and field in after:
            # u32 counters wrap; a difference modulo 2**32 stays right across one wrap.
            width = 8 * getattr(tcp_info, field).size
            out[key] = (after[field] - before[field]) % (1 << width)
    for key, field in GAUGES.items():
        if field in after:
            out[key] = after[field]
    return TcpDelta(**out)
