"""linux/ethtool.h and linux/ethtool_netlink(_generated).h: the ethtool generic netlink family
(message and attribute ids used by zcnet) and the SIOCETHTOOL ioctl structs for driver info and
ntuple rules. Names as in the headers; values checked against the 6.18 kernel's BTF."""

from __future__ import annotations

import ctypes

ETHTOOL_GENL_NAME = "ethtool"
ETHTOOL_GENL_VERSION = 1

# --- requests (user -> kernel) ---------------------------------------------------------------
ETHTOOL_MSG_STRSET_GET = 1
ETHTOOL_MSG_LINKINFO_GET = 2
ETHTOOL_MSG_FEATURES_GET = 11
ETHTOOL_MSG_FEATURES_SET = 12
ETHTOOL_MSG_PRIVFLAGS_GET = 13
ETHTOOL_MSG_PRIVFLAGS_SET = 14
ETHTOOL_MSG_RINGS_GET = 15
ETHTOOL_MSG_RINGS_SET = 16
ETHTOOL_MSG_CHANNELS_GET = 17
ETHTOOL_MSG_CHANNELS_SET = 18
ETHTOOL_MSG_RSS_GET = 38
ETHTOOL_MSG_RSS_SET = 48
ETHTOOL_MSG_RSS_CREATE_ACT = 49
ETHTOOL_MSG_RSS_DELETE_ACT = 50

# --- replies (kernel -> user) ----------------------------------------------------------------
ETHTOOL_MSG_STRSET_GET_REPLY = 1
ETHTOOL_MSG_FEATURES_GET_REPLY = 11
ETHTOOL_MSG_FEATURES_SET_REPLY = 12
ETHTOOL_MSG_PRIVFLAGS_GET_REPLY = 14
ETHTOOL_MSG_RINGS_GET_REPLY = 16
ETHTOOL_MSG_CHANNELS_GET_REPLY = 18

# --- header ------------------------------------------------------------------------------------
ETHTOOL_A_HEADER_DEV_INDEX = 1
ETHTOOL_A_HEADER_DEV_NAME = 2
ETHTOOL_A_HEADER_FLAGS = 3
ETHTOOL_A_HEADER_PHY_INDEX = 4

ETHTOOL_FLAG_COMPACT_BITSETS = 1 << 0
ETHTOOL_FLAG_OMIT_REPLY = 1 << 1
ETHTOOL_FLAG_STATS = 1 << 2

# --- bitsets -----------------------------------------------------------------------------------
ETHTOOL_A_BITSET_BIT_INDEX = 1
ETHTOOL_A_BITSET_BIT_NAME = 2
ETHTOOL_A_BITSET_BIT_VALUE = 3

ETHTOOL_A_BITSET_BITS_BIT = 1

ETHTOOL_A_BITSET_NOMASK = 1
ETHTOOL_A_BITSET_SIZE = 2
ETHTOOL_A_BITSET_BITS = 3
ETHTOOL_A_BITSET_VALUE = 4
ETHTOOL_A_BITSET_MASK = 5

# --- string sets -------------------------------------------------------------------------------
ETHTOOL_A_STRING_INDEX = 1
ETHTOOL_A_STRING_VALUE = 2
ETHTOOL_A_STRINGS_STRING = 1
ETHTOOL_A_STRINGSET_ID = 1
ETHTOOL_A_STRINGSET_COUNT = 2
ETHTOOL_A_STRINGSET_STRINGS = 3
ETHTOOL_A_STRINGSETS_STRINGSET = 1
ETHTOOL_A_STRSET_HEADER = 1
ETHTOOL_A_STRSET_STRINGSETS = 2
ETHTOOL_A_STRSET_COUNTS_ONLY = 3

# enum ethtool_stringset
ETH_SS_TEST = 0
ETH_SS_STATS = 1
ETH_SS_PRIV_FLAGS = 2
ETH_SS_NTUPLE_FILTERS = 3
ETH_SS_FEATURES = 4
ETH_SS_RSS_HASH_FUNCS = 5

# --- features ----------------------------------------------------------------------------------
ETHTOOL_A_FEATURES_HEADER = 1
ETHTOOL_A_FEATURES_HW = 2
ETHTOOL_A_FEATURES_WANTED = 3
ETHTOOL_A_FEATURES_ACTIVE = 4
ETHTOOL_A_FEATURES_NOCHANGE = 5

# --- private flags -----------------------------------------------------------------------------
ETHTOOL_A_PRIVFLAGS_HEADER = 1
ETHTOOL_A_PRIVFLAGS_FLAGS = 2

# --- rings -------------------------------------------------------------------------------------
ETHTOOL_A_RINGS_HEADER = 1
ETHTOOL_A_RINGS_RX_MAX = 2
ETHTOOL_A_RINGS_RX_MINI_MAX = 3
ETHTOOL_A_RINGS_RX_JUMBO_MAX = 4
ETHTOOL_A_RINGS_TX_MAX = 5
ETHTOOL_A_RINGS_RX = 6
ETHTOOL_A_RINGS_RX_MINI = 7
ETHTOOL_A_RINGS_RX_JUMBO = 8
ETHTOOL_A_RINGS_TX = 9
ETHTOOL_A_RINGS_RX_BUF_LEN = 10
ETHTOOL_A_RINGS_TCP_DATA_SPLIT = 11
ETHTOOL_A_RINGS_CQE_SIZE = 12
ETHTOOL_A_RINGS_TX_PUSH = 13
ETHTOOL_A_RINGS_RX_PUSH = 14
ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN = 15
ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN_MAX = 16
ETHTOOL_A_RINGS_HDS_THRESH = 17
ETHTOOL_A_RINGS_HDS_THRESH_MAX = 18

# enum ethtool_tcp_data_split
ETHTOOL_TCP_DATA_SPLIT_UNKNOWN = 0
ETHTOOL_TCP_DATA_SPLIT_DISABLED = 1
ETHTOOL_TCP_DATA_SPLIT_ENABLED = 2

# --- channels ----------------------------------------------------------------------------------
ETHTOOL_A_CHANNELS_HEADER = 1
ETHTOOL_A_CHANNELS_RX_MAX = 2
ETHTOOL_A_CHANNELS_TX_MAX = 3
ETHTOOL_A_CHANNELS_OTHER_MAX = 4
ETHTOOL_A_CHANNELS_COMBINED_MAX = 5
ETHTOOL_A_CHANNELS_RX_COUNT = 6
ETHTOOL_A_CHANNELS_TX_COUNT = 7
ETHTOOL_A_CHANNELS_OTHER_COUNT = 8
ETHTOOL_A_CHANNELS_COMBINED_COUNT = 9

# --- RSS ---------------------------------------------------------------------------------------
ETHTOOL_A_RSS_HEADER = 1
ETHTOOL_A_RSS_CONTEXT = 2
ETHTOOL_A_RSS_HFUNC = 3
ETHTOOL_A_RSS_INDIR = 4
ETHTOOL_A_RSS_HKEY = 5
ETHTOOL_A_RSS_INPUT_XFRM = 6
ETHTOOL_A_RSS_START_CONTEXT = 7
ETHTOOL_A_RSS_FLOW_HASH = 8

# ======================= SIOCETHTOOL ioctl (linux/sockios.h, linux/ethtool.h) ==================
SIOCETHTOOL = 0x8946
SIOCGIFINDEX = 0x8933
SIOCGIFADDR = 0x8915
SIOCGIFFLAGS = 0x8913
IFNAMSIZ = 16
IFF_UP = 0x1          # linux/if.h, net_device_flags
IFF_LOOPBACK = 0x8

ETHTOOL_GDRVINFO = 0x00000003
ETHTOOL_GRXRINGS = 0x0000002D
ETHTOOL_GRXCLSRLCNT = 0x0000002E
ETHTOOL_GRXCLSRULE = 0x0000002F
ETHTOOL_GRXCLSRLALL = 0x00000030
ETHTOOL_SRXCLSRLDEL = 0x00000031
ETHTOOL_SRXCLSRLINS = 0x00000032

# flow types
TCP_V4_FLOW = 0x01
UDP_V4_FLOW = 0x02
TCP_V6_FLOW = 0x05
UDP_V6_FLOW = 0x06
FLOW_EXT = 0x80000000
FLOW_MAC_EXT = 0x40000000
FLOW_RSS = 0x20000000

RX_CLS_FLOW_DISC = 0xFFFFFFFFFFFFFFFF
RX_CLS_FLOW_WAKE = 0xFFFFFFFFFFFFFFFE
RX_CLS_LOC_SPECIAL = 0x80000000
RX_CLS_LOC_ANY = 0xFFFFFFFF
RX_CLS_LOC_FIRST = 0xFFFFFFFE
RX_CLS_LOC_LAST = 0xFFFFFFFD

ETH_RXFH_CONTEXT_ALLOC = 0xFFFFFFFF

ETHTOOL_FWVERS_LEN = 32
ETHTOOL_BUSINFO_LEN = 32
ETHTOOL_EROMVERS_LEN = 32


class ethtool_drvinfo(ctypes.Structure):
    _fields_ = (
        ("cmd", ctypes.c_uint32),
        ("driver", ctypes.c_char * 32),
        ("version", ctypes.c_char * 32),
        ("fw_version", ctypes.c_char * ETHTOOL_FWVERS_LEN),
        ("bus_info", ctypes.c_char * ETHTOOL_BUSINFO_LEN),
        ("erom_version", ctypes.c_char * ETHTOOL_EROMVERS_LEN),
        ("reserved2", ctypes.c_char * 12),
        ("n_priv_flags", ctypes.c_uint32),
        ("n_stats", ctypes.c_uint32),
        ("testinfo_len", ctypes.c_uint32),
        ("eedump_len", ctypes.c_uint32),
        ("regdump_len", ctypes.c_uint32),
    )


# Fields marked __be16/__be32 in the header are network byte order: fill them with htons/htonl.
class ethtool_tcpip4_spec(ctypes.Structure):
    _fields_ = (
        ("ip4src", ctypes.c_uint32),
        ("ip4dst", ctypes.c_uint32),
        ("psrc", ctypes.c_uint16),
        ("pdst", ctypes.c_uint16),
        ("tos", ctypes.c_uint8),
    )


class ethtool_tcpip6_spec(ctypes.Structure):
    _fields_ = (
        ("ip6src", ctypes.c_uint32 * 4),
        ("ip6dst", ctypes.c_uint32 * 4),
        ("psrc", ctypes.c_uint16),
        ("pdst", ctypes.c_uint16),
        ("tclass", ctypes.c_uint8),
    )


class ethtool_flow_union(ctypes.Union):
    _fields_ = (
        ("tcp_ip4_spec", ethtool_tcpip4_spec),
        ("udp_ip4_spec", ethtool_tcpip4_spec),
        ("tcp_ip6_spec", ethtool_tcpip6_spec),
        ("udp_ip6_spec", ethtool_tcpip6_spec),
        ("hdata", ctypes.c_uint8 * 52),
    )


class ethtool_flow_ext(ctypes.Structure):
    _fields_ = (
        ("padding", ctypes.c_uint8 * 2),
        ("h_dest", ctypes.c_uint8 * 6),
        ("vlan_etype", ctypes.c_uint16),
        ("vlan_tci", ctypes.c_uint16),
        ("data", ctypes.c_uint32 * 2),
    )


class ethtool_rx_flow_spec(ctypes.Structure):
    _fields_ = (
        ("flow_type", ctypes.c_uint32),
        ("h_u", ethtool_flow_union),
        ("h_ext", ethtool_flow_ext),
        ("m_u", ethtool_flow_union),
        ("m_ext", ethtool_flow_ext),
        ("ring_cookie", ctypes.c_uint64),
        ("location", ctypes.c_uint32),
    )


class ethtool_rxnfc(ctypes.Structure):
    """Fixed part only; ETHTOOL_GRXCLSRLALL appends ``rule_cnt`` u32 locations after it."""

    _fields_ = (
        ("cmd", ctypes.c_uint32),
        ("flow_type", ctypes.c_uint32),
        ("data", ctypes.c_uint64),
        ("fs", ethtool_rx_flow_spec),
        ("rule_cnt", ctypes.c_uint32),  # union with rss_context
    )


# The kernel's layout: sizes the ioctl copies in and out (checked in tests).
SIZEOF_ETHTOOL_RX_FLOW_SPEC = 168
SIZEOF_ETHTOOL_RXNFC = 192
