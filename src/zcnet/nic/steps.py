"""The steps of ``zcnet nic setup``: each kind a title, an apply and an undo, looked up in
``STEPS`` by the ``kind`` a ``Step`` records.

``apply(dev, params, undo)`` fills ``undo`` with what its undo needs *before* changing
anything, so an undo works from the state file alone, in another process, and is harmless if
the apply never got to change the device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zcnet.nic import ethtool, ntuple
from zcnet.nic.device import Device, DeviceUnsupported

log = logging.getLogger(__name__)


@dataclass
class Step:
    kind: str
    params: dict[str, Any]
    status: str = "pending"  # pending -> applying -> done -> undone
    undo: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return STEPS[self.kind].title(self.params)


def channel_key(ch: dict[str, Any]) -> str:
    return "combined-count" if ch.get("combined-max", 0) else "rx-count"


def _channels_apply(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    ch = ethtool.channels_get(dev)
    key = channel_key(ch)
    undo["prior"] = {key: ch.get(key, 0)}
    ethtool.channels_set(dev, **{key.replace("-", "_"): p["count"]})


def _channels_undo(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    if undo.get("prior"):
        ethtool.channels_set(dev, **{k.replace("-", "_"): v for k, v in undo["prior"].items()})


def _feature_apply(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    undo["prior"] = p["name"] in ethtool.features_get(dev)["wanted"].value
    ethtool.features_set(dev, {p["name"]: p["on"]})


def _feature_undo(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    if "prior" in undo:
        ethtool.features_set(dev, {p["name"]: undo["prior"]})


def _rings_apply(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
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


def _rings_undo(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    if undo.get("prior") is not None:
        ethtool.rings_set(dev, **{p["name"]: undo["prior"]})


def _rss_apply(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    """Spread the default RSS context over every queue but ``queue``."""
    prior = ethtool.rss_get(dev).get("indir") or []
    others = [q for q in range(p["count"]) if q != p["queue"]]
    if not prior or not others:
        dev.raise_unsupported("an RSS indirection table", "move RSS off the queue")
    # A table the user never set is the kernel's default spread (i mod rings). Restoring it by
    # value would mark it user-configured, after which drivers refuse channel changes; an
    # empty table resets it to the default instead.
    rings = ntuple.rx_rings(dev)
    undo["default"] = prior == [i % rings for i in range(len(prior))]
    undo["prior"] = prior
    ethtool.rss_set(dev, [others[i % len(others)] for i in range(len(prior))])


def _rss_undo(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    if undo.get("default"):
        ethtool.rss_set(dev, [])
    elif undo.get("prior"):
        ethtool.rss_set(dev, undo["prior"])


def _rss_ctx_apply(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    undo["context"] = ethtool.rss_create(dev, [p["queue"]])


def _rss_ctx_undo(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    if undo.get("context"):
        ethtool.rss_delete(dev, undo["context"])


def _rule_apply(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    ctx = p.get("context_of")
    context = 0
    if ctx is not None:
        context = int(ctx)
    # With an RSS context the rule's action is an offset into the context's queues: 0.
    queue = 0 if context else p["queue"]
    undo["location"] = ntuple.rule_insert(dev, p["flow"], p["port"], queue, context)


def _rule_undo(dev: Device, p: dict[str, Any], undo: dict[str, Any]) -> None:
    if "location" in undo:
        ntuple.rule_delete(dev, undo["location"])
    else:
        log.warning("flow rule %s dst-port %s may be left: its location was never recorded",
                    p["flow"], p["port"])


@dataclass(frozen=True)
class StepKind:
    title: Callable[[dict[str, Any]], str]
    apply: Callable[[Device, dict[str, Any], dict[str, Any]], None]
    undo: Callable[[Device, dict[str, Any], dict[str, Any]], None]


STEPS: dict[str, StepKind] = {
    "channels": StepKind(lambda p: f"channels {p['count']}", _channels_apply, _channels_undo),
    "feature": StepKind(lambda p: f"{p['name']} {'on' if p['on'] else 'off'}",
                        _feature_apply, _feature_undo),
    "rings": StepKind(lambda p: f"{p['name']} {p['value']}", _rings_apply, _rings_undo),
    "rss": StepKind(lambda p: f"RSS off queue {p['queue']}", _rss_apply, _rss_undo),
    "rss-context": StepKind(lambda p: f"RSS context for queue {p['queue']}",
                            _rss_ctx_apply, _rss_ctx_undo),
    "flow-rule": StepKind(lambda p: f"{p['flow']} dst-port {p['port']} -> queue {p['queue']}",
                          _rule_apply, _rule_undo),
}
