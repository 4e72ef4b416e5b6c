"""Netlink attribute and message codec, sans I/O: bytes in, dicts out, and back.

Each family describes its attributes as data: an ``AttrSet`` maps attribute ids to a name, a
wire type and, for nests, the nested set. Decoding walks the bytes with bounds checks on every
length field, so a truncated or malformed reply raises ``MalformedReply`` instead of reading past
the end or looping; attribute ids the table does not know are skipped (newer kernels add them).

Some facts about netlink framing that shape this code:
- every message and every attribute is padded to 4 bytes, but the length fields exclude padding;
- a nest is an attribute whose payload is more attributes (the kernel sets NLA_F_NESTED on nests
  it emits in new families, old ones may not, so the table, not the flag, decides);
- "uint"/"sint" attributes in YNL specs are 4 or 8 bytes depending on the value;
- ``indexed-array`` nests hold elements whose attribute type is an index, not an id.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from zcnet.errors import ZcnetError
from zcnet.uapi.genetlink import GENLMSGHDR
from zcnet.uapi.netlink import (
    NLA_ALIGNTO,
    NLA_F_NESTED,
    NLA_HDRLEN,
    NLA_TYPE_MASK,
    NLATTR,
    NLM_F_CAPPED,
    NLMSG_ALIGNTO,
    NLMSG_HDRLEN,
    NLMSGERR_ATTR_MISS_TYPE,
    NLMSGERR_ATTR_MSG,
    NLMSGERR_ATTR_OFFS,
    NLMSGERR_ERROR,
    NLMSGHDR,
)

# What an attribute holds decoded (and what encoding takes): the integers of the fixed and uint
# types, a string, a binary payload, a flag's presence (True), a u32 array; a nest is a dict of
# its attributes, an indexed array or a repeated attribute a list.
NlValue: TypeAlias = int | str | bytes | bool | list["NlValue"] | dict[str, "NlValue"]
NlAttrs: TypeAlias = dict[str, NlValue]
# A request's attributes by name; None leaves one out.
NlRequest: TypeAlias = Mapping[str, "NlValue | None"]


class MalformedReply(ZcnetError):
    """The kernel (or something pretending to be it) sent bytes that do not parse."""

    def __init__(self, message: str) -> None:
        super().__init__(f"malformed netlink reply: {message}",
                         "report this with the kernel version; the reply was not understood")


class T(enum.Enum):
    """Wire types, as named in YNL specs."""

    U8 = "u8"
    U16 = "u16"
    U32 = "u32"
    U64 = "u64"
    S32 = "s32"
    UINT = "uint"  # 4 or 8 bytes
    STRING = "string"  # NUL-terminated on the wire
    BINARY = "binary"
    FLAG = "flag"  # presence only
    NEST = "nest"
    INDEXED = "indexed-array"  # nest of nests whose type field is an index
    U32_ARRAY = "u32-array"  # binary payload read as host-order u32 words


_FIXED: dict[T, struct.Struct] = {
    T.U8: struct.Struct("=B"),
    T.U16: struct.Struct("=H"),
    T.U32: struct.Struct("=I"),
    T.U64: struct.Struct("=Q"),
    T.S32: struct.Struct("=i"),
}
_U32 = _FIXED[T.U32]
_U64 = _FIXED[T.U64]


def align(n: int, to: int = NLA_ALIGNTO) -> int:
    return (n + to - 1) & ~(to - 1)


@dataclass(frozen=True)
class Attr:
    id: int
    name: str
    type: T
    nested: AttrSet | None = None
    multi: bool = False  # repeated attribute: decoded to a list, encoded from one


@dataclass
class AttrSet:
    """One attribute space of a family (an ``attribute-set`` in YNL terms)."""

    name: str
    attrs: list[Attr] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.by_id = {a.id: a for a in self.attrs}
        self.by_name = {a.name: a for a in self.attrs}

    def add(self, *attrs: Attr) -> AttrSet:
        """Add attributes after creation (for self-referencing or mutually nested sets)."""
        for a in attrs:
            self.attrs.append(a)
            self.by_id[a.id] = a
            self.by_name[a.name] = a
        return self


# One row of an attribute table: (id, name, type[, nested set][, multi]).
AttrRow: TypeAlias = (tuple[int, str, T] | tuple[int, str, T, "AttrSet"] | tuple[int, str, T, bool]
                      | tuple[int, str, T, "AttrSet", bool])


def attrset(name: str, *spec: AttrRow) -> AttrSet:
    """Build a set from rows ``(id, name, type[, nested][, multi])``: tables read like the spec."""
    attrs = []
    for row in spec:
        aid, aname, atype, *rest = row
        nested = rest[0] if rest and isinstance(rest[0], AttrSet) else None
        multi = bool(rest[-1]) if rest and isinstance(rest[-1], bool) else False
        attrs.append(Attr(aid, aname, atype, nested, multi))
    return AttrSet(name, attrs)


# --------------------------------------------------------------------------------- encoding


def _wrong(attr: Attr, value: NlValue, what: str) -> ZcnetError:
    return ZcnetError(f"netlink attribute {attr.name}: {value!r} is not {what}")


def _int(attr: Attr, value: NlValue) -> int:
    if not isinstance(value, (int, str)):
        raise _wrong(attr, value, "an integer")
    return int(value)


def _nest(attr: Attr, value: NlValue) -> NlAttrs:
    if not isinstance(value, dict):
        raise _wrong(attr, value, "a nest of attributes")
    return value


def _encode_value(attr: Attr, value: NlValue) -> bytes:
    t = attr.type
    if t in _FIXED:
        try:
            return _FIXED[t].pack(_int(attr, value))
        except struct.error as exc:
            raise ZcnetError(f"netlink attribute {attr.name}: {value!r} does not fit {t.value}") \
                from exc
    if t is T.UINT:
        v = _int(attr, value)
        if v < 0 or v >= 1 << 64:
            raise ZcnetError(f"netlink attribute {attr.name}: {value!r} does not fit uint")
        return _U32.pack(v) if v < 1 << 32 else _U64.pack(v)
    if t is T.STRING:
        return str(value).encode() + b"\0"
    if t is T.BINARY:
        if not isinstance(value, bytes):
            raise _wrong(attr, value, "bytes")
        return value
    if t is T.U32_ARRAY:
        if not isinstance(value, list):
            raise _wrong(attr, value, "a list of integers")
        return b"".join(_U32.pack(_int(attr, v)) for v in value)
    if t is T.FLAG:
        return b""
    if t is T.NEST:
        assert attr.nested is not None, attr.name
        return encode_attrs(attr.nested, _nest(attr, value))
    if t is T.INDEXED:
        assert attr.nested is not None, attr.name
        if not isinstance(value, list):
            raise _wrong(attr, value, "a list of nests")
        return b"".join(_attr_bytes(i, encode_attrs(attr.nested, _nest(attr, v)), nested=True)
                        for i, v in enumerate(value, 1))
    raise AssertionError(t)


def _attr_bytes(aid: int, payload: bytes, *, nested: bool = False) -> bytes:
    length = NLA_HDRLEN + len(payload)
    if length > 0xFFFF:
        raise ZcnetError(f"netlink attribute {aid} too long ({length} bytes)")
    head = NLATTR.pack(length, aid | (NLA_F_NESTED if nested else 0))
    return head + payload + b"\0" * (align(length) - length)


def encode_attrs(aset: AttrSet, values: NlRequest) -> bytes:
    """Encode ``{name: value}``; multi attributes take a list; a flag is sent when truthy."""
    out: list[bytes] = []
    for name, value in values.items():
        if value is None:
            continue
        attr = aset.by_name.get(name)
        if attr is None:
            raise ZcnetError(f"netlink attribute set {aset.name} has no attribute {name!r}")
        if attr.type is T.FLAG and not value:
            continue
        if attr.multi and not isinstance(value, list):
            raise _wrong(attr, value, "a list (a repeated attribute)")
        items = value if isinstance(value, list) and attr.multi else [value]
        nested = attr.type in (T.NEST, T.INDEXED)
        out.extend(_attr_bytes(attr.id, _encode_value(attr, v), nested=nested) for v in items)
    return b"".join(out)


# --------------------------------------------------------------------------------- decoding


def iter_attrs(data: bytes | memoryview,
               where: str = "message") -> Iterator[tuple[int, memoryview]]:
    """Yield ``(type, payload)`` for each attribute, checking every length against the buffer."""
    buf = memoryview(data)
    off = 0
    end = len(buf)
    while off < end:
        if end - off < NLA_HDRLEN:
            raise MalformedReply(f"{end - off} stray bytes after the attributes of {where}")
        length, atype = NLATTR.unpack_from(buf, off)
        if length < NLA_HDRLEN or off + length > end:
            raise MalformedReply(f"attribute {atype & NLA_TYPE_MASK} of {where} claims "
                                 f"{length} bytes, {end - off} left")
        yield atype & NLA_TYPE_MASK, buf[off + NLA_HDRLEN: off + length]
        off += align(length)


def _decode_value(attr: Attr, raw: memoryview, depth: int) -> NlValue:
    t = attr.type
    if t in _FIXED:
        s = _FIXED[t]
        if len(raw) != s.size:
            raise MalformedReply(f"{attr.name} is {len(raw)} bytes, {t.value} needs {s.size}")
        return s.unpack(raw)[0]
    if t is T.UINT:
        if len(raw) == 4:
            return _U32.unpack(raw)[0]
        if len(raw) == 8:
            return _U64.unpack(raw)[0]
        raise MalformedReply(f"{attr.name} is {len(raw)} bytes, uint needs 4 or 8")
    if t is T.STRING:
        b = bytes(raw)
        return b.split(b"\0", 1)[0].decode(errors="replace")
    if t is T.BINARY:
        return bytes(raw)
    if t is T.U32_ARRAY:
        if len(raw) % 4:
            raise MalformedReply(f"{attr.name} is {len(raw)} bytes, not a u32 array")
        return list(struct.unpack(f"={len(raw) // 4}I", raw))
    if t is T.FLAG:
        return True
    assert attr.nested is not None, attr.name
    if t is T.NEST:
        return decode_attrs(attr.nested, raw, depth + 1)
    if t is T.INDEXED:
        return [decode_attrs(attr.nested, sub, depth + 1)
                for _, sub in iter_attrs(raw, attr.name)]
    raise AssertionError(t)


MAX_DEPTH = 16  # the kernel nests a handful of levels; deeper input is hostile or broken


def decode_attrs(aset: AttrSet, data: bytes | memoryview, depth: int = 0) -> NlAttrs:
    """Decode attributes into ``{name: value}``; unknown ids are skipped."""
    if depth > MAX_DEPTH:
        raise MalformedReply(f"attributes nested deeper than {MAX_DEPTH} levels")
    out: NlAttrs = {}
    for aid, raw in iter_attrs(data, aset.name):
        attr = aset.by_id.get(aid)
        if attr is None:
            continue
        value = _decode_value(attr, raw, depth)
        if attr.multi:
            items = out.setdefault(attr.name, [])
            assert isinstance(items, list)  # only this loop adds a multi attribute
            items.append(value)
        else:
            out[attr.name] = value
    return out


# --------------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    type: int
    flags: int
    seq: int
    pid: int
    payload: memoryview


def encode_msg(mtype: int, flags: int, seq: int, payload: bytes, pid: int = 0) -> bytes:
    length = NLMSG_HDRLEN + len(payload)
    return NLMSGHDR.pack(length, mtype, flags, seq, pid) + payload


def encode_genl(family_id: int, cmd: int, version: int, flags: int, seq: int,
                attrs: bytes) -> bytes:
    return encode_msg(family_id, flags, seq, GENLMSGHDR.pack(cmd, version, 0) + attrs)


def iter_msgs(data: bytes | memoryview) -> Iterator[Message]:
    """Split one datagram into messages, checking each length."""
    buf = memoryview(data)
    off = 0
    end = len(buf)
    while off < end:
        if end - off < NLMSG_HDRLEN:
            raise MalformedReply(f"{end - off} bytes left, less than a message header")
        length, mtype, flags, seq, pid = NLMSGHDR.unpack_from(buf, off)
        if length < NLMSG_HDRLEN or off + length > end:
            raise MalformedReply(f"message claims {length} bytes, {end - off} left")
        yield Message(mtype, flags, seq, pid, buf[off + NLMSG_HDRLEN: off + length])
        off += align(length, NLMSG_ALIGNTO)


def split_genl(payload: memoryview) -> tuple[int, memoryview]:
    """Return ``(cmd, attributes)`` of a generic netlink message."""
    if len(payload) < GENLMSGHDR.size:
        raise MalformedReply("generic netlink message shorter than its header")
    cmd, _version, _ = GENLMSGHDR.unpack_from(payload)
    return cmd, payload[GENLMSGHDR.size:]


EXTACK = attrset(
    "nlmsgerr",
    (NLMSGERR_ATTR_MSG, "msg", T.STRING),
    (NLMSGERR_ATTR_OFFS, "offs", T.U32),
    (NLMSGERR_ATTR_MISS_TYPE, "miss-type", T.U32),
)


@dataclass(frozen=True)
class ErrorAck:
    """A decoded NLMSG_ERROR (error 0 is a plain ack) or the status word of NLMSG_DONE."""

    error: int  # a negative errno, or 0
    extack: NlAttrs


def parse_error(msg: Message) -> ErrorAck:
    """Decode an NLMSG_ERROR payload: errno, the echoed request, then extack TLVs."""
    p = msg.payload
    if len(p) < NLMSGERR_ERROR.size + NLMSG_HDRLEN:
        raise MalformedReply("error message shorter than struct nlmsgerr")
    (error,) = NLMSGERR_ERROR.unpack_from(p)
    # The echoed request is the full message unless the kernel capped it (NETLINK_CAP_ACK) or
    # the ack is a success, in which case only its header is there.
    orig_len = NLMSGHDR.unpack_from(p, NLMSGERR_ERROR.size)[0]
    echoed = NLMSG_HDRLEN if (msg.flags & NLM_F_CAPPED or error == 0) else orig_len
    tlv_off = NLMSGERR_ERROR.size + align(echoed, NLMSG_ALIGNTO)
    if echoed < NLMSG_HDRLEN or tlv_off > len(p):
        raise MalformedReply("error message echoes a request longer than itself")
    return ErrorAck(error, decode_attrs(EXTACK, p[tlv_off:]))


def parse_done(msg: Message) -> ErrorAck:
    """NLMSG_DONE of a dump carries a status int, then extack TLVs like an error."""
    p = msg.payload
    if len(p) < 4:
        return ErrorAck(0, {})
    (error,) = NLMSGERR_ERROR.unpack_from(p)
    return ErrorAck(error, decode_attrs(EXTACK, p[4:]))
