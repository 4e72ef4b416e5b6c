"""linux/errqueue.h, plus the IP/IPv6 RECVERR option numbers (linux/in.h, linux/in6.h) that carry
it as a control message. Names as in the headers."""

from __future__ import annotations

import ctypes

# linux/in.h / linux/in6.h: level and type of the cmsg that holds a sock_extended_err
SOL_IP = 0
IP_RECVERR = 11
SOL_IPV6 = 41
IPV6_RECVERR = 25

# linux/errqueue.h: ee_origin
SO_EE_ORIGIN_NONE = 0
SO_EE_ORIGIN_LOCAL = 1
SO_EE_ORIGIN_ICMP = 2
SO_EE_ORIGIN_ICMP6 = 3
SO_EE_ORIGIN_TXSTATUS = 4
SO_EE_ORIGIN_ZEROCOPY = 5
SO_EE_ORIGIN_TXTIME = 6
SO_EE_ORIGIN_TIMESTAMPING = SO_EE_ORIGIN_TXSTATUS

# ee_code for SO_EE_ORIGIN_ZEROCOPY: the kernel had to copy after all
SO_EE_CODE_ZEROCOPY_COPIED = 1


class sock_extended_err(ctypes.Structure):
    """For zero-copy completions ``ee_info``..``ee_data`` is the inclusive range of send ids."""

    _fields_ = (
        ("ee_errno", ctypes.c_uint32),
        ("ee_origin", ctypes.c_uint8),
        ("ee_type", ctypes.c_uint8),
        ("ee_code", ctypes.c_uint8),
        ("ee_pad", ctypes.c_uint8),
        ("ee_info", ctypes.c_uint32),
        ("ee_data", ctypes.c_uint32),
    )


SIZEOF_SOCK_EXTENDED_ERR = ctypes.sizeof(sock_extended_err)

# linux/in.h / linux/in6.h: path MTU, which decides whether an error-free datagram fits unfragmented
IP_MTU_DISCOVER = 10
IP_PMTUDISC_DO = 2
IP_MTU = 14
IPV6_MTU_DISCOVER = 23
IPV6_PMTUDISC_DO = 2
IPV6_MTU = 24
