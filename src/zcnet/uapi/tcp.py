"""linux/tcp.h: struct tcp_info from getsockopt(SOL_TCP, TCP_INFO). Names as in the header.

The kernel copies ``min(optlen, sizeof(struct tcp_info))`` bytes and writes back the length it
copied, so an older kernel leaves the tail of this struct zero; readers check the returned length
before trusting a late field.
"""

from __future__ import annotations

import ctypes

SOL_TCP = 6
TCP_INFO = 11

# enum tcp_ca_state
TCP_CA_Open = 0
TCP_CA_Disorder = 1
TCP_CA_CWR = 2
TCP_CA_Recovery = 3
TCP_CA_Loss = 4


class tcp_info(ctypes.Structure):
    _fields_ = (
        ("tcpi_state", ctypes.c_uint8),
        ("tcpi_ca_state", ctypes.c_uint8),
        ("tcpi_retransmits", ctypes.c_uint8),
        ("tcpi_probes", ctypes.c_uint8),
        ("tcpi_backoff", ctypes.c_uint8),
        ("tcpi_options", ctypes.c_uint8),
        ("tcpi_snd_wscale", ctypes.c_uint8, 4),
        ("tcpi_rcv_wscale", ctypes.c_uint8, 4),
        ("tcpi_delivery_rate_app_limited", ctypes.c_uint8, 1),
        ("tcpi_fastopen_client_fail", ctypes.c_uint8, 2),
        ("tcpi_rto", ctypes.c_uint32),
        ("tcpi_ato", ctypes.c_uint32),
        ("tcpi_snd_mss", ctypes.c_uint32),
        ("tcpi_rcv_mss", ctypes.c_uint32),
        ("tcpi_unacked", ctypes.c_uint32),
        ("tcpi_sacked", ctypes.c_uint32),
        ("tcpi_lost", ctypes.c_uint32),
        ("tcpi_retrans", ctypes.c_uint32),
        ("tcpi_fackets", ctypes.c_uint32),
        ("tcpi_last_data_sent", ctypes.c_uint32),
        ("tcpi_last_ack_sent", ctypes.c_uint32),
        ("tcpi_last_data_recv", ctypes.c_uint32),
        ("tcpi_last_ack_recv", ctypes.c_uint32),
        ("tcpi_pmtu", ctypes.c_uint32),
        ("tcpi_rcv_ssthresh", ctypes.c_uint32),
        ("tcpi_rtt", ctypes.c_uint32),
        ("tcpi_rttvar", ctypes.c_uint32),
        ("tcpi_snd_ssthresh", ctypes.c_uint32),
        ("tcpi_snd_cwnd", ctypes.c_uint32),
        ("tcpi_advmss", ctypes.c_uint32),
        ("tcpi_reordering", ctypes.c_uint32),
        ("tcpi_rcv_rtt", ctypes.c_uint32),
        ("tcpi_rcv_space", ctypes.c_uint32),
        ("tcpi_total_retrans", ctypes.c_uint32),
        ("tcpi_pacing_rate", ctypes.c_uint64),
        ("tcpi_max_pacing_rate", ctypes.c_uint64),
        ("tcpi_bytes_acked", ctypes.c_uint64),
        ("tcpi_bytes_received", ctypes.c_uint64),
        ("tcpi_segs_out", ctypes.c_uint32),
        ("tcpi_segs_in", ctypes.c_uint32),
        ("tcpi_notsent_bytes", ctypes.c_uint32),
        ("tcpi_min_rtt", ctypes.c_uint32),
        ("tcpi_data_segs_in", ctypes.c_uint32),
        ("tcpi_data_segs_out", ctypes.c_uint32),
        ("tcpi_delivery_rate", ctypes.c_uint64),
        ("tcpi_busy_time", ctypes.c_uint64),
        ("tcpi_rwnd_limited", ctypes.c_uint64),
        ("tcpi_sndbuf_limited", ctypes.c_uint64),
        ("tcpi_delivered", ctypes.c_uint32),
        ("tcpi_delivered_ce", ctypes.c_uint32),
        ("tcpi_bytes_sent", ctypes.c_uint64),
        ("tcpi_bytes_retrans", ctypes.c_uint64),
        ("tcpi_dsack_dups", ctypes.c_uint32),
        ("tcpi_reord_seen", ctypes.c_uint32),
        ("tcpi_rcv_ooopack", ctypes.c_uint32),
        ("tcpi_snd_wnd", ctypes.c_uint32),
        ("tcpi_rcv_wnd", ctypes.c_uint32),
        ("tcpi_rehash", ctypes.c_uint32),
        ("tcpi_total_rto", ctypes.c_uint16),
        ("tcpi_total_rto_recoveries", ctypes.c_uint16),
        ("tcpi_total_rto_time", ctypes.c_uint32),
    )
