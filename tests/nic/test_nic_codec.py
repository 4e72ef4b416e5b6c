"""The generic netlink codec without a kernel: attribute round trips, unknown attributes,
malformed input (hypothesis), and the request/reply state machine against a scripted peer."""

from __future__ import annotations

import contextlib
import errno
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zcnet.nic import ethtool, genl, netdev, nlattr, ntuple
from zcnet.nic.nlattr import T, attrset
from zcnet.uapi import ethtool as e
from zcnet.uapi import netlink as nl

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

INNER = attrset("inner", (1, "a", T.U8), (2, "b", T.STRING), (3, "c", T.FLAG))
OUTER = attrset(
    "outer",
    (1, "u8", T.U8), (2, "u16", T.U16), (3, "u32", T.U32), (4, "u64", T.U64),
    (5, "s32", T.S32), (6, "uint", T.UINT), (7, "str", T.STRING), (8, "bin", T.BINARY),
    (9, "flag", T.FLAG), (10, "nest", T.NEST, INNER), (11, "many", T.NEST, INNER, True),
    (12, "arr", T.INDEXED, INNER), (13, "words", T.U32_ARRAY),
)

VALUES = st.fixed_dictionaries({}, optional={
    "u8": st.integers(0, 0xFF), "u16": st.integers(0, 0xFFFF),
    "u32": st.integers(0, 0xFFFFFFFF), "u64": st.integers(0, 2**64 - 1),
    "s32": st.integers(-(2**31), 2**31 - 1), "uint": st.integers(0, 2**64 - 1),
    "str": st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                   max_size=40),
    "bin": st.binary(max_size=64), "flag": st.just(True),
    "nest": st.fixed_dictionaries({}, optional={"a": st.integers(0, 255),
                                                "b": st.text("xyz", max_size=5),
                                                "c": st.just(True)}),
    "many": st.lists(st.fixed_dictionaries({"a": st.integers(0, 255)}), min_size=1, max_size=4),
    "arr": st.lists(st.fixed_dictionaries({"b": st.text("ab", max_size=3)}), max_size=4),
    "words": st.lists(st.integers(0, 0xFFFFFFFF), max_size=8),
})


@given(VALUES)
def test_attrs_round_trip(values):
    assert nlattr.decode_attrs(OUTER, nlattr.encode_attrs(OUTER, values)) == values


def test_uint_uses_the_smallest_width():
    assert len(nlattr.encode_attrs(OUTER, {"uint": 5})) == 8
    assert len(nlattr.encode_attrs(OUTER, {"uint": 2**40})) == 12


def test_unknown_attributes_are_skipped_but_known_ones_kept():
    newer = attrset("newer", *((a.id, a.name, a.type, *( [a.nested] if a.nested else []))
                               for a in INNER.attrs), (200, "future", T.U64))
    data = nlattr.encode_attrs(newer, {"a": 7, "future": 99, "b": "x"})
    assert nlattr.decode_attrs(INNER, data) == {"a": 7, "b": "x"}


def test_flag_false_and_none_are_not_sent():
    assert nlattr.encode_attrs(OUTER, {"flag": False, "u8": None}) == b""


def test_value_out_of_range_is_a_clear_error():
    with pytest.raises(nlattr.ZcnetError, match="does not fit u8"):
        nlattr.encode_attrs(OUTER, {"u8": 256})
    with pytest.raises(nlattr.ZcnetError, match="no attribute 'nope'"):
        nlattr.encode_attrs(OUTER, {"nope": 1})


@settings(max_examples=400)
@given(st.binary(max_size=300))
def test_decoder_survives_random_bytes(data):
    with contextlib.suppress(nlattr.MalformedReply):
        nlattr.decode_attrs(OUTER, data)


OUTER_NAMES = {1: "u8", 2: "u16", 3: "u32", 4: "u64", 5: "s32", 6: "uint", 7: "str", 8: "bin",
               9: "flag", 10: "nest", 11: "many", 12: "arr", 13: "words"}


def _boundaries(raw: bytes) -> list[tuple[int, int, int]]:
    """(end, padded end, attribute id) of each top-level attribute, read by hand: u16 length,
    u16 type (low 14 bits), payload padded to 4 bytes (the last one's padding may be missing,
    as the kernel's nla_ok allows)."""
    out, off = [], 0
    while off < len(raw):
        length, atype = struct.unpack_from("=HH", raw, off)
        out.append((off + length, off + ((length + 3) & ~3), atype & 0x3FFF))
        off = out[-1][1]
    return out


def _prefix(values: dict, ids: list[int]) -> dict:
    """What the first attributes (``ids``) of ``values``' encoding hold."""
    out: dict = {}
    for aid in ids:
        name = OUTER_NAMES[aid]
        if name == "many":  # one attribute per element
            out[name] = values[name][:len(out.get(name, [])) + 1]
        else:
            out[name] = values[name]
    return out


@settings(max_examples=300)
@given(VALUES, st.data())
def test_truncated_encodings_decode_a_prefix_or_raise(values, data):
    """Cut at an attribute boundary, the decoder cannot know and must give exactly the values
    before the cut; cut inside an attribute, it must say the reply is malformed."""
    raw = nlattr.encode_attrs(OUTER, values)
    bounds = _boundaries(raw)
    assert bounds == [] or bounds[-1][1] == len(raw)
    cut = data.draw(st.integers(0, len(raw)))
    whole = sum(end <= cut for end, _, _ in bounds)
    at_boundary = cut == 0 or (whole > 0 and cut <= bounds[whole - 1][1])
    if at_boundary:
        assert nlattr.decode_attrs(OUTER, raw[:cut]) == \
            _prefix(values, [aid for _, _, aid in bounds[:whole]])
    else:
        with pytest.raises(nlattr.MalformedReply):
            nlattr.decode_attrs(OUTER, raw[:cut])


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_message_splitter_survives_random_bytes(data):
    try:
        for msg in nlattr.iter_msgs(data):
            if msg.type == nl.NLMSG_ERROR:
                nlattr.parse_error(msg)
            else:
                nlattr.split_genl(msg.payload)
    except nlattr.MalformedReply:
        pass


def test_wrong_width_integer_is_malformed():
    raw = nlattr._attr_bytes(3, b"\x01\x02")  # u32 attribute with 2 bytes
    with pytest.raises(nlattr.MalformedReply, match="u32 needs 4"):
        nlattr.decode_attrs(OUTER, raw)


def test_deep_nesting_is_refused():
    deep = attrset("deep")
    deep.add(nlattr.Attr(1, "d", T.NEST, deep))
    raw = b""
    for _ in range(40):
        raw = nlattr._attr_bytes(1, raw, nested=True)
    with pytest.raises(nlattr.MalformedReply, match="deeper"):
        nlattr.decode_attrs(deep, raw)


# ------------------------------------------------------------------ error messages / extack


def _error_msg(err: int, seq: int, extack: str = "", capped: bool = True) -> bytes:
    orig = nl.NLMSGHDR.pack(36, 0x20, nl.NLM_F_REQUEST | nl.NLM_F_ACK, seq, 0)
    body = struct.pack("=i", err) + orig
    flags = nl.NLM_F_CAPPED if capped else 0
    if extack:
        body += nlattr.encode_attrs(nlattr.EXTACK, {"msg": extack})
        flags |= nl.NLM_F_ACK_TLVS
    return nlattr.encode_msg(nl.NLMSG_ERROR, flags, seq, body)


def test_error_keeps_errno_and_extack():
    (msg,) = nlattr.iter_msgs(_error_msg(-errno.EOPNOTSUPP, 1, "no tcp-data-split here"))
    ack = nlattr.parse_error(msg)
    assert ack.error == -errno.EOPNOTSUPP
    assert ack.extack == {"msg": "no tcp-data-split here"}


def test_uncapped_error_echo_longer_than_message_is_malformed():
    (msg,) = nlattr.iter_msgs(_error_msg(-errno.EINVAL, 1, capped=False))
    with pytest.raises(nlattr.MalformedReply, match="echoes"):
        nlattr.parse_error(msg)


# ------------------------------------------------------------------ ethtool bitsets, ntuple


@given(st.sets(st.integers(0, 70)), st.sets(st.integers(0, 70)))
def test_compact_bitset_round_trip(on, off):
    names = [f"f{i}" for i in range(71)]
    changes = {f"f{i}": True for i in on} | {f"f{i}": False for i in off - on}
    enc = ethtool.encode_bitset_compact(changes, names)
    raw = nlattr.encode_attrs(ethtool.BITSET, enc)
    bs = ethtool.decode_bitset(nlattr.decode_attrs(ethtool.BITSET, raw), names)
    assert bs.value == {n for n, v in changes.items() if v}
    assert bs.mask == set(changes)


def test_verbose_bitset_round_trip():
    enc = ethtool.encode_bitset_verbose({"rx-gro": True, "rx-ntuple-filter": False})
    raw = nlattr.encode_attrs(ethtool.BITSET, enc)
    bs = ethtool.decode_bitset(nlattr.decode_attrs(ethtool.BITSET, raw))
    assert bs.value == {"rx-gro"} and bs.mask == {"rx-gro", "rx-ntuple-filter"}


def test_bind_rx_request_encoding():
    req = netdev.bind_rx_request(7, 12, [3, 4])
    raw = nlattr.encode_attrs(netdev.DMABUF, req)
    back = nlattr.decode_attrs(netdev.DMABUF, raw)
    assert back == {"ifindex": 7, "fd": 12,
                    "queues": [{"id": 3, "type": 0}, {"id": 4, "type": 0}]}
    # each queue is its own NLA_F_NESTED attribute of type NETDEV_A_DMABUF_QUEUES
    types = [t for t, _ in nlattr.iter_attrs(raw)]
    assert types.count(2) == 2


def test_ntuple_rule_layout():
    import ctypes

    assert ctypes.sizeof(e.ethtool_rx_flow_spec) == e.SIZEOF_ETHTOOL_RX_FLOW_SPEC
    assert ctypes.sizeof(e.ethtool_rxnfc) == e.SIZEOF_ETHTOOL_RXNFC
    nfc = ntuple.flow_rule("tcp6", 9999, 3, rss_context=2)
    raw = bytes(nfc)
    assert struct.unpack_from("=I", raw, 16)[0] == e.TCP_V6_FLOW | e.FLOW_RSS
    # h_u.tcp_ip6_spec.pdst sits after two 16-byte addresses and psrc: network byte order
    assert raw[16 + 4 + 34: 16 + 4 + 36] == (9999).to_bytes(2, "big")
    assert struct.unpack_from("=Q", raw, 16 + 152)[0] == 3  # ring_cookie
    assert struct.unpack_from("=I", raw, 16 + 160)[0] == e.RX_CLS_LOC_ANY
    assert struct.unpack_from("=I", raw, 184)[0] == 2  # rss_context
    with pytest.raises(ValueError):
        ntuple.flow_rule("tcp4", 0, 1)


# ------------------------------------------------------------------ socket state machine


class ScriptedSocket(genl.GenlSocket):
    """A GenlSocket whose 'kernel' is the other end of a socketpair, fed by the test."""

    def __init__(self, timeout: float = 1.0) -> None:
        self.sock, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.settimeout(timeout)
        self.netns = None
        self.timeout = timeout
        self._seq = 0
        self._families = {"fam": genl.Family("fam", 0x30, 1, {1: 0}, {})}
        self._buf = bytearray(genl.RECV_BUF)
        self.sent: list[bytes] = []
        self.script: list[bytes] = []

    def _send(self, data: bytes) -> None:
        self.sent.append(data)
        for reply in self.script:
            self.peer.send(reply)

    def close(self) -> None:
        self.sock.close()
        self.peer.close()


def _genl_reply(seq: int, attrs: dict, flags: int = 0) -> bytes:
    return nlattr.encode_genl(0x30, 1, 1, flags, seq, nlattr.encode_attrs(INNER, attrs))


def _done(seq: int, err: int = 0) -> bytes:
    return nlattr.encode_msg(nl.NLMSG_DONE, nl.NLM_F_MULTI, seq, struct.pack("=i", err))


def test_dump_collects_parts_until_done_and_skips_stale(no_leaks):
    with ScriptedSocket() as s:
        multi = nl.NLM_F_MULTI
        s.script = [_genl_reply(99, {"a": 0}, multi),  # stale sequence number: ignored
                    _genl_reply(1, {"a": 1}, multi) + _genl_reply(1, {"a": 2}, multi),
                    _genl_reply(1, {"a": 3}, multi), _done(1)]
        assert s.dump("fam", 1, INNER, {}) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_do_returns_reply_then_ack(no_leaks):
    with ScriptedSocket() as s:
        s.script = [_genl_reply(1, {"b": "ok"}), _error_msg(0, 1)]
        assert s.do("fam", 1, INNER, {"a": 1}) == {"b": "ok"}
        hdr = nl.NLMSGHDR.unpack_from(s.sent[0])
        assert hdr[1] == 0x30 and hdr[2] == nl.NLM_F_REQUEST | nl.NLM_F_ACK


def test_kernel_error_raises_with_extack(no_leaks):
    with ScriptedSocket() as s:
        s.script = [_error_msg(-errno.EOPNOTSUPP, 1, "setting TCP data split is not supported")]
        with pytest.raises(genl.NetlinkError) as info:
            s.do("fam", 1, INNER, {}, what="set rings")
        assert info.value.errno == errno.EOPNOTSUPP
        assert "TCP data split" in str(info.value) and "set rings" in str(info.value)


def test_dump_error_in_done(no_leaks):
    with ScriptedSocket() as s:
        s.script = [_genl_reply(1, {"a": 1}, nl.NLM_F_MULTI), _done(1, -errno.EMSGSIZE)]
        with pytest.raises(genl.NetlinkError) as info:
            s.dump("fam", 1, INNER, {})
        assert info.value.errno == errno.EMSGSIZE


def test_interrupted_dump_is_retried(no_leaks):
    with ScriptedSocket() as s:
        intr = nl.NLM_F_MULTI | nl.NLM_F_DUMP_INTR
        s.script = [_genl_reply(1, {"a": 1}, intr), _done(1)]
        original = s._send

        def send_then_clean(data: bytes) -> None:
            original(data)
            s.script = [_genl_reply(2, {"a": 5}, nl.NLM_F_MULTI), _done(2)]

        s._send = send_then_clean  # type: ignore[method-assign]
        assert s.dump("fam", 1, INNER, {}) == [{"a": 5}]
        assert len(s.sent) == 2


def test_truncated_reply_raises_not_hangs(no_leaks):
    with ScriptedSocket() as s:
        good = _genl_reply(1, {"b": "hello"})
        s.script = [good[:-3]]
        with pytest.raises(nlattr.MalformedReply):
            s.do("fam", 1, INNER, {})


def test_silent_kernel_times_out(no_leaks):
    with ScriptedSocket(timeout=0.2) as s:
        s.script = []
        with pytest.raises(genl.NetlinkError) as info:
            s.do("fam", 1, INNER, {}, what="rings")
        assert info.value.errno == errno.ETIMEDOUT


@settings(max_examples=150, deadline=None)
@given(st.binary(min_size=1, max_size=120))
def test_random_reply_bytes_raise_cleanly(data):
    with ScriptedSocket(timeout=0.05) as s:
        s.script = [data]
        with contextlib.suppress(nlattr.MalformedReply, genl.NetlinkError):
            s.do("fam", 1, INNER, {})


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_ethtool_reply_decoding_survives_random_bytes(data):
    names = [f"f{i}" for i in range(40)]
    with contextlib.suppress(nlattr.MalformedReply):
        d = nlattr.decode_attrs(ethtool.FEATURES, data)
        for key in ("hw", "wanted", "active", "nochange"):
            if key in d:
                ethtool.decode_bitset(d[key], names)
                ethtool.decode_bitset(d[key])
