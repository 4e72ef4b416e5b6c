"""The steps of ``zcnet nic setup``: each kind a title, an apply and an undo, looked up in
``STEPS`` by the ``kind`` a ``Step`` records.

``apply(dev, params, undo)`` fills ``undo`` with what its undo needs *before* changing
anything, so an undo works from the state file alone, in another process, and is harmless if
the apply never got to change the device.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from zcnet.jsonvalue import JSONObject, JSONValue
from zcnet.nic import ethtool, ntuple
from zcnet.nic.device import Device, DeviceUnsupported

log = logging.getLogger(__name__)


@dataclass
class Step:
    kind: str
    params: JSONObject
    status: str = "pending"  # pending -> applying -> done -> undone
    undo: JSONObject = field(default_factory=dict)

    @property
    def title(self) -> str:
        return STEPS[self.kind].title(self.params)


def queues_text(queues: list[int] | tuple[int, ...]) -> str:
    """"queue 2" or "queues 2,3", for messages and step titles."""
    return f"queue{'s' if len(queues) > 1 else ''} {','.join(map(str, queues))}"


def channel_key(ch: JSONObject) -> str:
    return "combined-count" if ch.get("combined-max", 0) else "rx-count"


def _channels_apply(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    ch = ethtool.channels_get(dev)
    key = channel_key(ch)
    undo["prior"] = {key: ch.get(key, 0)}
    ethtool.channels_set(dev, **{key.replace("-", "_"): p["count"]})


def _channels_undo(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    if undo.get("prior"):
        ethtool.channels_set(dev, **{k.replace("-", "_"): v for k, v in undo["prior"].items()})


def _feature_apply(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    undo["prior"] = p["name"] in ethtool.features_get(dev)["wanted"].value
    ethtool.features_set(dev, {p["name"]: p["on"]})


def _feature_undo(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    if "prior" in undo:
        ethtool.features_set(dev, {p["name"]: undo["prior"]})


def _rings_apply(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    try:
        rings = ethtool.rings_get(dev)
    except DeviceUnsupported as exc:
        # No ring query at all: name the setting the user asked for, not "rings".
        raise DeviceUnsupported(exc.driver, p["name"], exc.errno, exc.extack) from exc
    if p["name"] not in rings:
        dev.raise_unsupported(p["name"], f"set {p['name']}")
    prior = rings.get(p["name"])
    if prior == "unknown":
        prior = "auto"  # ETHTOOL_TCP_DATA_SPLIT_UNKNOWN: let the driver decide again
    undo["prior"] = prior
    ethtool.rings_set(dev, **{p["name"]: p["value"]})


def _rings_undo(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    if undo.get("prior") is not None:
        ethtool.rings_set(dev, **{p["name"]: undo["prior"]})


def _spread(queues: list[int], size: int) -> list[int]:
    return [queues[i % len(queues)] for i in range(size)]


def _rss_apply(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    """Spread the default RSS context over every queue but ``queues``."""
    prior = ethtool.rss_get(dev).get("indir") or []
    others = [q for q in range(p["count"]) if q not in p["queues"]]
    if not prior or not others:
        dev.raise_unsupported("an RSS indirection table",
                              f"move RSS off {queues_text(p['queues'])}")
    # A table the user never set is the kernel's default spread (i mod rings). Restoring it by
    # value would mark it user-configured, after which drivers refuse channel changes; an
    # empty table resets it to the default instead.
    rings = ntuple.rx_rings(dev)
    undo["default"] = prior == [i % rings for i in range(len(prior))]
    undo["prior"] = prior
    ethtool.rss_set(dev, _spread(others, len(prior)))


def _rss_undo(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    if undo.get("default"):
        ethtool.rss_set(dev, [])
    elif undo.get("prior"):
        ethtool.rss_set(dev, undo["prior"])


def _rss_ctx_apply(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    """A new RSS context spreading over ``queues``: a table of the device's size (the kernel
    repeats a shorter one only when it divides that size)."""
    size = len(ethtool.rss_get(dev).get("indir") or []) or len(p["queues"])
    undo["context"] = ethtool.rss_create(dev, _spread(p["queues"], size))


def _rss_ctx_undo(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    if undo.get("context"):
        ethtool.rss_delete(dev, undo["context"])


def _rule_apply(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    ctx = p.get("context_of")
    context = 0
    if ctx is not None:
        context = int(ctx)
    # With an RSS context the rule's action is an offset into the context's queues: 0.
    queue = 0 if context else p["queue"]
    undo["location"] = ntuple.rule_insert(dev, p["flow"], p["port"], queue, context)


def _rule_title(p: JSONObject) -> str:
    to = "the RSS context" if p["context_step"] is not None else f"queue {p['queue']}"
    return f"{p['flow']} dst-port {p['port']} -> {to}"


def _rule_undo(dev: Device, p: JSONObject, undo: JSONObject) -> None:
    if "location" in undo:
        ntuple.rule_delete(dev, undo["location"])
    else:
        log.warning("flow rule %s dst-port %s may be left: its location was never recorded",
                    p["flow"], p["port"])


# -------------------------------------------------------------------- what a state file holds
#
# A state file may be hand-edited, truncated or another program's: ``restore`` applies nothing
# until every step's params and undo record have the shape its apply wrote, so no undo ever
# runs on half-parsed data. Each field is a predicate; ``problem`` names the first that fails.

Check = Callable[[JSONValue], bool]


def _int(lo: int, hi: int) -> Check:
    return lambda v: type(v) is int and lo <= v <= hi


def _one_of(*choices: object) -> Check:
    return lambda v: isinstance(v, str) and v in choices


_U16, _U32 = _int(0, 0xFFFF), _int(0, 0xFFFF_FFFF)


def _bool(v: JSONValue) -> bool:
    return type(v) is bool


def _feature(v: JSONValue) -> bool:
    """An ethtool feature name (ETH_GSTRING_LEN - 1 characters); the kernel's own list is
    checked again when one is set."""
    return isinstance(v, str) and re.fullmatch(r"[\w.-]{1,31}", v) is not None


# The rings a step sets, and the values each takes (tcp-data-split by name, hds-thresh a u32).
RING_VALUES: dict[str, Check] = {"tcp-data-split": _one_of(*ethtool.TCP_DATA_SPLIT_VALUE),
                                 "hds-thresh": _U32}


def _prior_channels(v: JSONValue) -> bool:
    return (isinstance(v, dict) and len(v) == 1
            and all(k in ("combined-count", "rx-count") and _U16(n) for k, n in v.items()))


def _unique_ints(lo: int, limit: int) -> Check:
    ok = _int(lo, 0xFFFF)
    return lambda v: (isinstance(v, list) and 0 < len(v) <= limit and all(ok(x) for x in v)
                      and len(set(v)) == len(v))


queue_list, port_list = _unique_ints(0, 1024), _unique_ints(1, 1024)


def _indir(v: JSONValue) -> bool:
    return isinstance(v, list) and len(v) <= 0x10000 and all(_U32(q) for q in v)


def _fields(record: JSONValue, spec: dict[str, Check], where: str, *, required: bool) -> str | None:
    if not isinstance(record, dict):
        return f"{where} is not an object"
    if unknown := [k for k in record if k not in spec]:
        return f"{where} has an unknown field {str(unknown[0])[:40]!r}"
    for name, ok in spec.items():
        if name not in record:
            if required:
                return f"{where} lacks {name!r}"
        elif not ok(record[name]):
            return f"{where}.{name} is {str(record[name])[:40]!r}, not what setup writes"
    return None


@dataclass(frozen=True)
class StepKind:
    title: Callable[[JSONObject], str]
    apply: Callable[[Device, JSONObject, JSONObject], None]
    undo: Callable[[Device, JSONObject, JSONObject], None]
    params: dict[str, Check]    # what setup plans: every field required
    recorded: dict[str, Check]  # what apply records for the undo: any may be missing
    # Fields that are only valid together (a ring's value depends on which ring).
    consistent: Callable[[JSONObject, JSONObject], bool] = lambda p, u: True

    def problem(self, params: JSONValue, undo: JSONValue, where: str) -> str | None:
        """Why ``params``/``undo`` (from a state file) are not what this kind writes, or None."""
        why = (_fields(params, self.params, f"{where}.params", required=True)
               or _fields(undo, self.recorded, f"{where}.undo", required=False))
        if why is None and not self.consistent(params, undo):
            why = f"{where}: a value is not one {self.title(params)!r} takes"
        return why


def _rings_consistent(p: JSONObject, u: JSONObject) -> bool:
    ok = RING_VALUES[p["name"]]
    return ok(p["value"]) and (u.get("prior") is None or ok(u["prior"]))


STEPS: dict[str, StepKind] = {
    "channels": StepKind(lambda p: f"channels {p['count']}", _channels_apply, _channels_undo,
                         {"count": _int(1, 0xFFFF)}, {"prior": _prior_channels}),
    "feature": StepKind(lambda p: f"{p['name']} {'on' if p['on'] else 'off'}",
                        _feature_apply, _feature_undo,
                        {"name": _feature, "on": _bool}, {"prior": _bool}),
    "rings": StepKind(lambda p: f"{p['name']} {p['value']}", _rings_apply, _rings_undo,
                      {"name": _one_of(*RING_VALUES), "value": lambda v: True},
                      {"prior": lambda v: True}, _rings_consistent),
    "rss": StepKind(lambda p: f"RSS off {queues_text(p['queues'])}", _rss_apply, _rss_undo,
                    {"queues": queue_list, "count": _int(1, 0xFFFF)},
                    {"default": _bool, "prior": _indir}),
    "rss-context": StepKind(lambda p: f"RSS context for {queues_text(p['queues'])}",
                            _rss_ctx_apply, _rss_ctx_undo,
                            {"queues": queue_list}, {"context": _int(1, 0xFFFF_FFFF)}),
    "flow-rule": StepKind(_rule_title, _rule_apply, _rule_undo,
                          {"flow": _one_of(*ntuple.FLOW_TYPES), "port": _int(1, 0xFFFF),
                           "queue": _U16,
                           "context_step": lambda v: v is None or _int(0, 0xFFFF)(v)},
                          {"location": _U32}),
}
