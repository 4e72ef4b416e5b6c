"""The ethtool generic netlink family: rings (incl. header-data split), channels, features,
private flags, string sets and RSS (incl. contexts). Attribute tables follow ethtool.yaml.

Every call takes a ``Device`` (``zcnet.nic.device``), which owns the socket and knows the
driver's name for error messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from zcnet.errors import UsageError
from zcnet.nic.device import Device
from zcnet.nic.nlattr import MalformedReply, NlAttrs, NlValue, T, attrset
from zcnet.uapi import ethtool as e

FAMILY = e.ETHTOOL_GENL_NAME

HEADER = attrset(
    "header",
    (e.ETHTOOL_A_HEADER_DEV_INDEX, "dev-index", T.U32),
    (e.ETHTOOL_A_HEADER_DEV_NAME, "dev-name", T.STRING),
    (e.ETHTOOL_A_HEADER_FLAGS, "flags", T.U32),
    (e.ETHTOOL_A_HEADER_PHY_INDEX, "phy-index", T.U32),
)
BITSET_BIT = attrset(
    "bitset-bit",
    (e.ETHTOOL_A_BITSET_BIT_INDEX, "index", T.U32),
    (e.ETHTOOL_A_BITSET_BIT_NAME, "name", T.STRING),
    (e.ETHTOOL_A_BITSET_BIT_VALUE, "value", T.FLAG),
)
BITSET_BITS = attrset("bitset-bits", (e.ETHTOOL_A_BITSET_BITS_BIT, "bit", T.NEST, BITSET_BIT,
                                      True))
BITSET = attrset(
    "bitset",
    (e.ETHTOOL_A_BITSET_NOMASK, "nomask", T.FLAG),
    (e.ETHTOOL_A_BITSET_SIZE, "size", T.U32),
    (e.ETHTOOL_A_BITSET_BITS, "bits", T.NEST, BITSET_BITS),
    (e.ETHTOOL_A_BITSET_VALUE, "value", T.BINARY),
    (e.ETHTOOL_A_BITSET_MASK, "mask", T.BINARY),
)
STRING = attrset("string", (e.ETHTOOL_A_STRING_INDEX, "index", T.U32),
                 (e.ETHTOOL_A_STRING_VALUE, "value", T.STRING))
STRINGS = attrset("strings", (e.ETHTOOL_A_STRINGS_STRING, "string", T.NEST, STRING, True))
STRINGSET = attrset(
    "stringset",
    (e.ETHTOOL_A_STRINGSET_ID, "id", T.U32),
    (e.ETHTOOL_A_STRINGSET_COUNT, "count", T.U32),
    (e.ETHTOOL_A_STRINGSET_STRINGS, "strings", T.NEST, STRINGS, True),
)
STRINGSETS = attrset("stringsets", (e.ETHTOOL_A_STRINGSETS_STRINGSET, "stringset", T.NEST,
                                    STRINGSET, True))
STRSET = attrset(
    "strset",
    (e.ETHTOOL_A_STRSET_HEADER, "header", T.NEST, HEADER),
    (e.ETHTOOL_A_STRSET_STRINGSETS, "stringsets", T.NEST, STRINGSETS),
    (e.ETHTOOL_A_STRSET_COUNTS_ONLY, "counts-only", T.FLAG),
)
FEATURES = attrset(
    "features",
    (e.ETHTOOL_A_FEATURES_HEADER, "header", T.NEST, HEADER),
    (e.ETHTOOL_A_FEATURES_HW, "hw", T.NEST, BITSET),
    (e.ETHTOOL_A_FEATURES_WANTED, "wanted", T.NEST, BITSET),
    (e.ETHTOOL_A_FEATURES_ACTIVE, "active", T.NEST, BITSET),
    (e.ETHTOOL_A_FEATURES_NOCHANGE, "nochange", T.NEST, BITSET),
)
PRIVFLAGS = attrset(
    "privflags",
    (e.ETHTOOL_A_PRIVFLAGS_HEADER, "header", T.NEST, HEADER),
    (e.ETHTOOL_A_PRIVFLAGS_FLAGS, "flags", T.NEST, BITSET),
)
RINGS = attrset(
    "rings",
    (e.ETHTOOL_A_RINGS_HEADER, "header", T.NEST, HEADER),
    (e.ETHTOOL_A_RINGS_RX_MAX, "rx-max", T.U32),
    (e.ETHTOOL_A_RINGS_RX_MINI_MAX, "rx-mini-max", T.U32),
    (e.ETHTOOL_A_RINGS_RX_JUMBO_MAX, "rx-jumbo-max", T.U32),
    (e.ETHTOOL_A_RINGS_TX_MAX, "tx-max", T.U32),
    (e.ETHTOOL_A_RINGS_RX, "rx", T.U32),
    (e.ETHTOOL_A_RINGS_RX_MINI, "rx-mini", T.U32),
    (e.ETHTOOL_A_RINGS_RX_JUMBO, "rx-jumbo", T.U32),
    (e.ETHTOOL_A_RINGS_TX, "tx", T.U32),
    (e.ETHTOOL_A_RINGS_RX_BUF_LEN, "rx-buf-len", T.U32),
    (e.ETHTOOL_A_RINGS_TCP_DATA_SPLIT, "tcp-data-split", T.U8),
    (e.ETHTOOL_A_RINGS_CQE_SIZE, "cqe-size", T.U32),
    (e.ETHTOOL_A_RINGS_TX_PUSH, "tx-push", T.U8),
    (e.ETHTOOL_A_RINGS_RX_PUSH, "rx-push", T.U8),
    (e.ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN, "tx-push-buf-len", T.U32),
    (e.ETHTOOL_A_RINGS_TX_PUSH_BUF_LEN_MAX, "tx-push-buf-len-max", T.U32),
    (e.ETHTOOL_A_RINGS_HDS_THRESH, "hds-thresh", T.U32),
    (e.ETHTOOL_A_RINGS_HDS_THRESH_MAX, "hds-thresh-max", T.U32),
)
CHANNELS = attrset(
    "channels",
    (e.ETHTOOL_A_CHANNELS_HEADER, "header", T.NEST, HEADER),
    (e.ETHTOOL_A_CHANNELS_RX_MAX, "rx-max", T.U32),
    (e.ETHTOOL_A_CHANNELS_TX_MAX, "tx-max", T.U32),
    (e.ETHTOOL_A_CHANNELS_OTHER_MAX, "other-max", T.U32),
    (e.ETHTOOL_A_CHANNELS_COMBINED_MAX, "combined-max", T.U32),
    (e.ETHTOOL_A_CHANNELS_RX_COUNT, "rx-count", T.U32),
    (e.ETHTOOL_A_CHANNELS_TX_COUNT, "tx-count", T.U32),
    (e.ETHTOOL_A_CHANNELS_OTHER_COUNT, "other-count", T.U32),
    (e.ETHTOOL_A_CHANNELS_COMBINED_COUNT, "combined-count", T.U32),
)
RSS = attrset(
    "rss",
    (e.ETHTOOL_A_RSS_HEADER, "header", T.NEST, HEADER),
    (e.ETHTOOL_A_RSS_CONTEXT, "context", T.U32),
    (e.ETHTOOL_A_RSS_HFUNC, "hfunc", T.U32),
    (e.ETHTOOL_A_RSS_INDIR, "indir", T.U32_ARRAY),
    (e.ETHTOOL_A_RSS_HKEY, "hkey", T.BINARY),
    (e.ETHTOOL_A_RSS_INPUT_XFRM, "input-xfrm", T.U32),
    (e.ETHTOOL_A_RSS_START_CONTEXT, "start-context", T.U32),
)

TCP_DATA_SPLIT = {
    e.ETHTOOL_TCP_DATA_SPLIT_UNKNOWN: "unknown",
    e.ETHTOOL_TCP_DATA_SPLIT_DISABLED: "off",
    e.ETHTOOL_TCP_DATA_SPLIT_ENABLED: "on",
}
TCP_DATA_SPLIT_VALUE = {"auto": e.ETHTOOL_TCP_DATA_SPLIT_UNKNOWN,
                        "off": e.ETHTOOL_TCP_DATA_SPLIT_DISABLED,
                        "on": e.ETHTOOL_TCP_DATA_SPLIT_ENABLED}

# Setting names for error messages ("driver veth does not support tcp-data-split").
RING_SETTINGS = tuple(a.name for a in RINGS.attrs if a.name != "header"
                      and not a.name.endswith("-max"))
CHANNEL_SETTINGS = ("rx-count", "tx-count", "other-count", "combined-count")


# ----------------------------------------------------------------------------------- bitsets


@dataclass(frozen=True)
class Bitset:
    """A decoded ethtool bitset: the names (or ``#index``) that are set, and the mask if any."""

    size: int
    value: frozenset[str]
    mask: frozenset[str] | None


def _words_to_bits(raw: bytes, size: int) -> list[int]:
    bits = []
    for i in range(min(size, len(raw) * 8)):
        word = int.from_bytes(raw[(i // 32) * 4:(i // 32) * 4 + 4], "little")
        if word >> (i % 32) & 1:
            bits.append(i)
    return bits


def bits_to_words(indices: set[int], size: int) -> bytes:
    words = [0] * ((size + 31) // 32)
    for i in indices:
        words[i // 32] |= 1 << (i % 32)
    return b"".join(w.to_bytes(4, "little") for w in words)


def decode_bitset(d: NlValue, names: list[str] | None = None) -> Bitset:
    """Read either form. Compact bitsets carry no names: pass the string set to map indices."""
    if not isinstance(d, dict):
        raise MalformedReply(f"a bitset is {type(d).__name__}, not a nest")
    size = d.get("size", 0)

    def name_of(i: int) -> str:
        return names[i] if names is not None and 0 <= i < len(names) else f"#{i}"

    if "value" in d:  # compact
        value = frozenset(name_of(i) for i in _words_to_bits(d["value"], size))
        mask = None if "mask" not in d else frozenset(
            name_of(i) for i in _words_to_bits(d["mask"], size))
        return Bitset(size, value, mask)
    bits = d.get("bits", {}).get("bit", [])
    listed = [(b.get("name") or name_of(b.get("index", -1)), b.get("value", False)) for b in bits]
    if d.get("nomask"):
        return Bitset(size, frozenset(n for n, _ in listed), None)
    return Bitset(size, frozenset(n for n, v in listed if v), frozenset(n for n, _ in listed))


def encode_bitset_verbose(changes: Mapping[str, bool]) -> NlAttrs:
    """Value/mask form by name: only the listed bits change."""
    return {"bits": {"bit": [{"name": n, "value": bool(v)} for n, v in changes.items()]}}


def encode_bitset_compact(changes: Mapping[str, bool], names: list[str]) -> NlAttrs:
    index = {n: i for i, n in enumerate(names)}
    unknown = [n for n in changes if n not in index]
    if unknown:
        raise KeyError(", ".join(unknown))
    size = len(names)
    value = {index[n] for n, v in changes.items() if v}
    mask = {index[n] for n in changes}
    return {"size": size, "value": bits_to_words(value, size), "mask": bits_to_words(mask, size)}


# ----------------------------------------------------------------------------------- requests


def _hdr(dev: Device, flags: int = 0) -> NlAttrs:
    h: NlAttrs = {"dev-index": dev.ifindex}
    if flags:
        h["flags"] = flags
    return h


def _strip(d: NlAttrs | None) -> NlAttrs:
    out = dict(d or {})
    out.pop("header", None)
    return out


def strset_get(dev: Device, set_id: int) -> list[str]:
    """The names of one string set (e.g. ETH_SS_FEATURES), ordered by index."""
    r = dev.genl_do(FAMILY, e.ETHTOOL_MSG_STRSET_GET, STRSET,
                    {"header": _hdr(dev), "stringsets": {"stringset": [{"id": set_id}]}},
                    what=f"string set {set_id}")
    names: dict[int, str] = {}
    for ss in (r or {}).get("stringsets", {}).get("stringset", []):
        if ss.get("id") != set_id:
            continue
        for group in ss.get("strings", []):
            for s in group.get("string", []):
                names[s.get("index", len(names))] = s.get("value", "")
    return [names.get(i, f"#{i}") for i in range(max(names, default=-1) + 1)]


def rings_get(dev: Device) -> NlAttrs:
    r = _strip(dev.genl_do(FAMILY, e.ETHTOOL_MSG_RINGS_GET, RINGS, {"header": _hdr(dev)},
                           what="rings", setting="rings"))
    if "tcp-data-split" in r:
        r["tcp-data-split"] = TCP_DATA_SPLIT.get(r["tcp-data-split"], str(r["tcp-data-split"]))
    return r


def rings_set(dev: Device, **values: int | str) -> None:
    """Set ring parameters by spec name, e.g. ``rings_set(dev, tcp_data_split="on",
    hds_thresh=0)``. The error names the first setting when the driver refuses."""
    attrs = {k.replace("_", "-"): v for k, v in values.items()}
    unknown = [k for k in attrs if k not in RING_SETTINGS]
    if unknown:
        raise UsageError(f"unknown ring setting {', '.join(unknown)}",
                         f"one of {', '.join(RING_SETTINGS)}")
    split = attrs.get("tcp-data-split")
    if isinstance(split, str):
        if split not in TCP_DATA_SPLIT_VALUE:
            raise UsageError(f"tcp-data-split {split!r}", "on, off or auto")
        attrs["tcp-data-split"] = TCP_DATA_SPLIT_VALUE[split]
    setting = ", ".join(attrs)
    dev.genl_do(FAMILY, e.ETHTOOL_MSG_RINGS_SET, RINGS, {"header": _hdr(dev), **attrs},
                what=f"set rings {setting}", setting=setting)


def channels_get(dev: Device) -> NlAttrs:
    return _strip(dev.genl_do(FAMILY, e.ETHTOOL_MSG_CHANNELS_GET, CHANNELS,
                              {"header": _hdr(dev)}, what="channels", setting="channels"))


def channels_set(dev: Device, **counts: int) -> None:
    attrs = {k.replace("_", "-"): v for k, v in counts.items()}
    setting = ", ".join(attrs)
    dev.genl_do(FAMILY, e.ETHTOOL_MSG_CHANNELS_SET, CHANNELS, {"header": _hdr(dev), **attrs},
                what=f"set channels {setting}", setting=f"channels {setting}")


def features_get(dev: Device, compact: bool = False) -> dict[str, Bitset]:
    """hw (changeable), wanted, active and nochange feature sets by name."""
    flags = e.ETHTOOL_FLAG_COMPACT_BITSETS if compact else 0
    names = strset_get(dev, e.ETH_SS_FEATURES) if compact else None
    r = _strip(dev.genl_do(FAMILY, e.ETHTOOL_MSG_FEATURES_GET, FEATURES,
                           {"header": _hdr(dev, flags)}, what="features", setting="features"))
    return {k: decode_bitset(v, names) for k, v in r.items()}


def features_set(dev: Device, changes: Mapping[str, bool], compact: bool = False) -> None:
    """Ask for features by name; raises ``Unsupported`` for a feature the driver cannot change
    (the kernel accepts such requests silently, so the result is read back and compared)."""
    names = strset_get(dev, e.ETH_SS_FEATURES)
    unknown = [n for n in changes if n not in names]
    if unknown:
        raise UsageError(f"unknown feature {', '.join(unknown)} on {dev.where}",
                         "feature names as the kernel spells them, e.g. rx-ntuple-filter, "
                         "rx-gro-hw (see 'zcnet nic show')")
    wanted = encode_bitset_compact(changes, names) if compact else encode_bitset_verbose(changes)
    what = "set features " + ", ".join(f"{n} {'on' if v else 'off'}" for n, v in changes.items())
    dev.genl_do(FAMILY, e.ETHTOOL_MSG_FEATURES_SET, FEATURES,
                {"header": _hdr(dev, e.ETHTOOL_FLAG_OMIT_REPLY), "wanted": wanted},
                what=what, setting=", ".join(changes))
    active = features_get(dev)["active"].value
    refused = [n for n, v in changes.items() if (n in active) != bool(v)]
    if refused:
        dev.raise_unsupported(", ".join(refused), what)


def privflags_get(dev: Device) -> dict[str, bool]:
    r = dev.genl_do(FAMILY, e.ETHTOOL_MSG_PRIVFLAGS_GET, PRIVFLAGS, {"header": _hdr(dev)},
                    what="private flags", setting="private flags")
    bs = decode_bitset((r or {}).get("flags", {}))
    return {n: n in bs.value for n in sorted(bs.mask or bs.value)}


def privflags_set(dev: Device, changes: Mapping[str, bool]) -> None:
    dev.genl_do(FAMILY, e.ETHTOOL_MSG_PRIVFLAGS_SET, PRIVFLAGS,
                {"header": _hdr(dev), "flags": encode_bitset_verbose(changes)},
                what="set private flags", setting="private flag " + ", ".join(changes))


def rss_get(dev: Device, context: int = 0) -> NlAttrs:
    attrs: NlAttrs = {"header": _hdr(dev)}
    if context:
        attrs["context"] = context
    return _strip(dev.genl_do(FAMILY, e.ETHTOOL_MSG_RSS_GET, RSS, attrs,
                              what=f"RSS context {context}", setting="RSS"))


def rss_contexts(dev: Device) -> list[NlAttrs]:
    """Every additional RSS context of this device (a dump filtered to it)."""
    rows = dev.genl_dump(FAMILY, e.ETHTOOL_MSG_RSS_GET, RSS,
                         {"header": _hdr(dev), "start-context": 1},
                         what="RSS contexts", setting="RSS contexts")
    return [_strip(r) for r in rows if r.get("context", 0)]


def rss_set(dev: Device, indir: list[int] | None, context: int = 0) -> None:
    """Set the indirection table; an empty list resets it to the driver's default spread."""
    attrs: dict[str, NlValue | None] = {"header": _hdr(dev), "indir": [*indir]
                                        if indir is not None else None}
    if context:
        attrs["context"] = context
    dev.genl_do(FAMILY, e.ETHTOOL_MSG_RSS_SET, RSS, attrs, what="set RSS indirection",
                setting="RSS indirection table")


def rss_create(dev: Device, indir: list[int] | None = None) -> int:
    """Create an additional RSS context; returns its id."""
    attrs: dict[str, NlValue | None] = {"header": _hdr(dev), "indir": [*indir]
                                        if indir is not None else None}
    r = dev.genl_do(FAMILY, e.ETHTOOL_MSG_RSS_CREATE_ACT, RSS, attrs,
                    what="create RSS context", setting="RSS contexts")
    if not r or "context" not in r:
        dev.raise_unsupported("RSS contexts", "create RSS context: no context id in reply")
    return int(r["context"])  # type: ignore[index]


def rss_delete(dev: Device, context: int) -> None:
    dev.genl_do(FAMILY, e.ETHTOOL_MSG_RSS_DELETE_ACT, RSS,
                {"header": _hdr(dev), "context": context},
                what=f"delete RSS context {context}", setting="RSS contexts")
