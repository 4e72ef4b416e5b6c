"""linux/udp.h socket options. Names as in the header."""

from __future__ import annotations

SOL_UDP = 17
UDP_CORK = 1
UDP_ENCAP = 100
UDP_NO_CHECK6_TX = 101
UDP_NO_CHECK6_RX = 102
UDP_SEGMENT = 103  # int: GSO segment size; as setsockopt or as a per-send cmsg (u16)
UDP_GRO = 104
