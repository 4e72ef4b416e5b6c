"""linux/netlink.h: message header, flags, control message types, extended-ack attributes and
the netlink socket options. Names as in the header."""

from __future__ import annotations

import struct

NETLINK_ROUTE = 0
NETLINK_GENERIC = 16

# struct nlmsghdr { __u32 nlmsg_len; __u16 nlmsg_type; __u16 nlmsg_flags; __u32 nlmsg_seq;
#                   __u32 nlmsg_pid; }
NLMSGHDR = struct.Struct("=IHHII")
NLMSG_ALIGNTO = 4
NLMSG_HDRLEN = NLMSGHDR.size

# struct nlattr { __u16 nla_len; __u16 nla_type; }
NLATTR = struct.Struct("=HH")
NLA_ALIGNTO = 4
NLA_HDRLEN = NLATTR.size
NLA_F_NESTED = 1 << 15
NLA_F_NET_BYTEORDER = 1 << 14
NLA_TYPE_MASK = ~(NLA_F_NESTED | NLA_F_NET_BYTEORDER) & 0xFFFF

# struct nlmsgerr { int error; struct nlmsghdr msg; ... }
NLMSGERR_ERROR = struct.Struct("=i")

NLM_F_REQUEST = 0x01
NLM_F_MULTI = 0x02
NLM_F_ACK = 0x04
NLM_F_ECHO = 0x08
NLM_F_DUMP_INTR = 0x10
NLM_F_DUMP_FILTERED = 0x20
NLM_F_ROOT = 0x100
NLM_F_MATCH = 0x200
NLM_F_ATOMIC = 0x400
NLM_F_DUMP = NLM_F_ROOT | NLM_F_MATCH
# flags on NLMSG_ERROR acks
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200

NLMSG_NOOP = 0x1
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
NLMSG_OVERRUN = 0x4
NLMSG_MIN_TYPE = 0x10

# enum nlmsgerr_attrs
NLMSGERR_ATTR_UNUSED = 0
NLMSGERR_ATTR_MSG = 1
NLMSGERR_ATTR_OFFS = 2
NLMSGERR_ATTR_COOKIE = 3
NLMSGERR_ATTR_POLICY = 4
NLMSGERR_ATTR_MISS_TYPE = 5
NLMSGERR_ATTR_MISS_NEST = 6

# socket options at SOL_NETLINK
SOL_NETLINK = 270
NETLINK_ADD_MEMBERSHIP = 1
NETLINK_DROP_MEMBERSHIP = 2
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
NETLINK_GET_STRICT_CHK = 12
