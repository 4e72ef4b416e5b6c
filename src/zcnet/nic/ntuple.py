"""ntuple flow steering rules through the SIOCETHTOOL ioctl (ETHTOOL_SRXCLSRLINS/DEL): a TCP
destination port to an RX queue, optionally through an RSS context. Netlink has no message for
these yet, so this is the one ioctl path of the control plane."""

from __future__ import annotations

import socket

from zcnet.nic.device import Device
from zcnet.uapi import ethtool as e

FLOW_TYPES = {"tcp4": e.TCP_V4_FLOW, "tcp6": e.TCP_V6_FLOW}


def flow_rule(flow: str, port: int, queue: int, rss_context: int = 0,
              location: int = e.RX_CLS_LOC_ANY) -> e.ethtool_rxnfc:
    """The rxnfc for 'flow-type <flow> dst-port <port> action <queue> [context <ctx>]'."""
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range")
    nfc = e.ethtool_rxnfc(cmd=e.ETHTOOL_SRXCLSRLINS)
    fs = nfc.fs
    fs.flow_type = FLOW_TYPES[flow] | (e.FLOW_RSS if rss_context else 0)
    spec, mask = (fs.h_u.tcp_ip4_spec, fs.m_u.tcp_ip4_spec) if flow == "tcp4" else \
        (fs.h_u.tcp_ip6_spec, fs.m_u.tcp_ip6_spec)
    spec.pdst = socket.htons(port)
    mask.pdst = 0xFFFF  # a set mask bit means "match this bit" for rxnfc rules
    fs.ring_cookie = queue
    fs.location = location
    nfc.rule_cnt = rss_context  # the union's other member, rss_context
    return nfc


def rule_insert(dev: Device, flow: str, port: int, queue: int, rss_context: int = 0) -> int:
    """Insert a rule at any free location; returns the location the driver chose."""
    nfc = flow_rule(flow, port, queue, rss_context)
    try:
        dev.ifreq_ioctl(e.SIOCETHTOOL, nfc)
    except OSError as exc:
        dev.translate(exc, f"insert ntuple rule {flow} dst-port {port} -> queue {queue}",
                      "ntuple flow rules")
    return int(nfc.fs.location)


def rule_delete(dev: Device, location: int) -> None:
    nfc = e.ethtool_rxnfc(cmd=e.ETHTOOL_SRXCLSRLDEL)
    nfc.fs.location = location
    try:
        dev.ifreq_ioctl(e.SIOCETHTOOL, nfc)
    except OSError as exc:
        dev.translate(exc, f"delete ntuple rule {location}", "ntuple flow rules")


def rule_count(dev: Device) -> int:
    nfc = e.ethtool_rxnfc(cmd=e.ETHTOOL_GRXCLSRLCNT)
    try:
        dev.ifreq_ioctl(e.SIOCETHTOOL, nfc)
    except OSError as exc:
        dev.translate(exc, "count ntuple rules", "ntuple flow rules")
    return int(nfc.rule_cnt)


def rx_rings(dev: Device) -> int:
    """ETHTOOL_GRXRINGS: how many RX rings flow rules and RSS can target."""
    nfc = e.ethtool_rxnfc(cmd=e.ETHTOOL_GRXRINGS)
    try:
        dev.ifreq_ioctl(e.SIOCETHTOOL, nfc)
    except OSError as exc:
        dev.translate(exc, "count RX rings", "RX ring count (GRXRINGS)")
    return int(nfc.data)
