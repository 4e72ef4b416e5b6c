"""Prepare a NIC for zero-copy receive, and put it back exactly as it was.

The configuration is the one the kernel's iou-zcrx and devmem selftests use: enough channels,
ntuple on (and HW-GRO where the driver has it), header-data split on with hds-thresh 0, RSS
moved off the target queues, and flow rules steering the ports there: each port to one queue,
or every port to an RSS context that spreads its flows over the queues.

Some facts about doing this safely:
- Each step is data (``kind`` + ``params``) with an apply and an undo in ``zcnet.nic.steps``;
  the undo needs only what the step recorded (prior values, a rule location), so it works from
  a state file in another process.
- The state file is written before each step starts and after it finishes. A process killed
  between (or during) steps leaves a file that ``restore`` finishes; a step caught mid-way is
  undone too, since each undo writes back prior values and is harmless if nothing changed.
- A failed step undoes the finished ones in reverse; the error names the step and carries the
  kernel's reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from zcnet.errors import UsageError, ZcnetError
from zcnet.jsonvalue import JSONObject, JSONValue
from zcnet.netns import netns_path
from zcnet.nic import ethtool, ntuple
from zcnet.nic.device import Device
from zcnet.nic.ifname import ifname_problem
from zcnet.nic.steps import STEPS, Step, channel_key, port_list, queue_list, queues_text
from zcnet.userfile import FileProblem, file_in_the_way, read_text

log = logging.getLogger(__name__)

STATE_VERSION = 2     # 2: several queues and ports; version 1 files (one of each) still read
STATE_DIR_ENV = "ZCNET_STATE_DIR"
DEFAULT_STATE_DIR = "/run/zcnet"
MODES = ("zcrx", "devmem")
NTUPLE = "rx-ntuple-filter"
HW_GRO = "rx-gro-hw"
# Drivers whose traffic, without flow steering of their own, lands on the RX queue the peer
# chose: an upstream netdevsim port (no rx-ntuple-filter) receives on the queue numbered like
# its linked peer's TX queue, so steering is the sender's (XPS) and setup leaves ntuple, RSS
# and flow rules out. zcnet's test kernel gives netdevsim ntuple and RSS: the full plan runs.
STEERED_BY_PEER = frozenset({"netdevsim"})


MAX_PORTS = 64   # a rule per port and flow type: up to 128 rules


def int_tuple(value: int | Iterable[int]) -> tuple[int, ...]:
    """One queue or port, or several, as a tuple."""
    return (value,) if isinstance(value, int) else tuple(value)


def iface_args(ifname: str, netns: str | None) -> str:
    """The interface as the nic commands take it, for hints: "eth2", or "eth2 --netns lab"."""
    return ifname + (f" --netns {netns}" if netns else "")


@dataclass(init=False)
class NicConfig:
    """``ports`` of ``ifname`` steered to ``queues`` (an int is one queue or one port).

    With several queues, either ``rss_context``: one RSS context spreads the flows of every
    port over the queues (by the NIC's flow hash), or one flow rule per port, the ports dealt
    to the queues in turn (``ports[i]`` -> ``queues[i % len(queues)]``)."""

    ifname: str
    queues: tuple[int, ...]
    ports: tuple[int, ...]
    mode: str = "zcrx"
    rss_context: bool = False
    netns: str | None = None
    flows: tuple[str, ...] = ("tcp4", "tcp6")

    def __init__(self, ifname: str, queues: int | Iterable[int], ports: int | Iterable[int],
                 mode: str = "zcrx", rss_context: bool = False, netns: str | None = None,
                 flows: tuple[str, ...] = ("tcp4", "tcp6")) -> None:
        self.ifname, self.queues, self.ports = ifname, int_tuple(queues), int_tuple(ports)
        self.mode, self.rss_context, self.netns, self.flows = mode, rss_context, netns, flows

    def queue_of(self, port: int) -> int | None:
        """The queue a per-port rule steers ``port`` to (None with an RSS context, which
        spreads each port over all the queues, or for a port not set up)."""
        if self.rss_context or port not in self.ports:
            return None
        return self.queues[self.ports.index(port) % len(self.queues)]

    def check(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}", f"one of {', '.join(MODES)}")
        for what, values, lo in (("queue", self.queues, 0), ("port", self.ports, 1)):
            if not values:
                raise UsageError(f"no {what} given", f"give at least one {what}")
            if bad := [v for v in values if type(v) is not int or not lo <= v <= 0xFFFF]:
                raise UsageError(f"{what} {bad[0]!r} is not a {'TCP port' if lo else 'queue id'}")
            if len(set(values)) != len(values):
                raise UsageError(f"a {what} is given twice in {','.join(map(str, values))}")
        if len(self.ports) > MAX_PORTS:
            raise UsageError(f"{len(self.ports)} ports: at most {MAX_PORTS} (a flow rule each)",
                             "use fewer ports")
        bad = [f for f in self.flows if f not in ntuple.FLOW_TYPES]
        if bad:
            raise UsageError(f"unknown flow type {', '.join(bad)}",
                             f"one of {', '.join(ntuple.FLOW_TYPES)}")
        if not self.rss_context and len(self.ports) < len(self.queues):
            idle = self.queues[len(self.ports):]
            raise UsageError(
                f"{len(self.queues)} queues and {len(self.ports)} port(s): a flow rule steers a "
                f"port to one queue, so {queues_text(idle)} would get no flow",
                f"give a port per queue, or --rss-context to spread each port over "
                f"{queues_text(self.queues)}")


class SetupError(ZcnetError):
    """A step failed; ``step`` names it and ``__cause__`` is the kernel's refusal."""

    def __init__(self, step: str, reason: str, undone: list[str], hint: str | None) -> None:
        done = f"; undone: {', '.join(undone)}" if undone else "; nothing had been changed"
        super().__init__(f"setup step '{step}' failed: {reason}{done}", hint)
        self.step = step


def plan(dev: Device, cfg: NicConfig) -> list[Step]:
    """The steps for ``cfg`` on this device as it is now (steps already satisfied are left
    out, so restore never changes what setup did not)."""
    cfg.check()
    steps: list[Step] = []
    ch = ethtool.channels_get(dev)
    key = channel_key(ch)
    count, top = ch.get(key, 0), ch.get(key.replace("-count", "-max"), 0)
    # Every set-up queue, and one more that RSS keeps for every other flow.
    need = max(max(cfg.queues) + 1, len(cfg.queues) + 1)
    if need > top:
        verb = "needs" if len(cfg.queues) == 1 else "need"
        raise UsageError(f"{queues_text(cfg.queues)} {verb} {need} channels, {dev.where} has "
                         f"at most {top}", "pick lower or fewer queues")
    if count < need:
        steps.append(Step("channels", {"count": need}))
    # Order as in the kernel's selftests: HDS first (the step most drivers refuse), then the
    # offloads, RSS and the rules. HW-GRO is optional: skipped where the driver lacks it.
    steps.append(Step("rings", {"name": "tcp-data-split", "value": "on"}))
    steps.append(Step("rings", {"name": "hds-thresh", "value": 0}))
    feats = ethtool.features_get(dev)
    if dev.driver in STEERED_BY_PEER and NTUPLE not in feats["hw"].value:
        return steps
    if HW_GRO in feats["hw"].value and HW_GRO not in feats["active"].value:
        steps.append(Step("feature", {"name": HW_GRO, "on": True}))
    if NTUPLE not in feats["active"].value:
        steps.append(Step("feature", {"name": NTUPLE, "on": True}))
    # RSS leaves the queues even with a context of their own: any other flow RSS put there
    # (a control connection) would find its payload unreadable once a provider holds them.
    steps.append(Step("rss", {"queues": list(cfg.queues), "count": max(count, need)}))
    ctx_index = None
    if cfg.rss_context:
        steps.append(Step("rss-context", {"queues": list(cfg.queues)}))
        ctx_index = len(steps) - 1
    for port in cfg.ports:
        queue = cfg.queue_of(port)
        for flow in cfg.flows:
            steps.append(Step("flow-rule", {"flow": flow, "port": port,
                                            "queue": cfg.queues[0] if queue is None else queue,
                                            "context_step": ctx_index}))
    return steps


# ------------------------------------------------------------------------------- state file


MAX_STATE = 1 << 20          # a state file is a few KiB; an RSS table adds a few more
MAX_STEPS = 8 + MAX_PORTS * len(ntuple.FLOW_TYPES)   # a rule per port and flow type
_STATUSES = ("pending", "applying", "done", "undone")
_WRITE_FIX = f"set {STATE_DIR_ENV} to a directory root can write (default {DEFAULT_STATE_DIR})"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def state_path(ifname: str, netns: str | None = None) -> Path:
    """Where setup of ``ifname`` (in ``netns``) keeps its state; both names are checked first,
    since they become part of a path."""
    if (why := ifname_problem(ifname)) is not None:
        raise UsageError(f"interface name {ifname!r} {why}", "give a name from 'ip link'")
    if netns is not None:
        netns_path(netns)   # refuses names with '/', "." and ".."
    return state_dir() / f"nic-{netns or '-'}-{ifname}.json"


def _state_dir_ready() -> Path:
    """The state directory, created if missing; a one-line error if it cannot be used."""
    d = state_dir()
    if file_in_the_way(d) == d:
        raise ZcnetError(f"the state directory {d} is not a directory", _WRITE_FIX)
    try:
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as exc:   # a read-only file system; a file where a parent should be
        raise ZcnetError(f"cannot create the state directory {d}: {exc.strerror}",
                         _WRITE_FIX) from None
    return d


def _write_state(path: Path, doc: JSONObject) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):   # never made, or the file system is read-only
            tmp.unlink()
        raise ZcnetError(f"cannot write state file {path}: {exc.strerror}", _WRITE_FIX) from None


def _doc(cfg: NicConfig, ifindex: int, steps: list[Step]) -> JSONObject:
    c = asdict(cfg)
    c["flows"] = list(cfg.flows)
    return {"version": STATE_VERSION, "ifname": cfg.ifname, "netns": cfg.netns,
            "ifindex": ifindex, "config": c, "steps": [asdict(s) for s in steps]}


def _already(cfg: NicConfig, path: Path) -> ZcnetError:
    return ZcnetError(f"{cfg.ifname} is already set up by zcnet (state in {path})",
                      f"run 'zcnet nic restore {iface_args(cfg.ifname, cfg.netns)}' first")


def _claim(path: Path, cfg: NicConfig) -> None:
    """Create the state file exclusively, so two concurrent setups cannot both proceed."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    except FileExistsError:
        raise _already(cfg, path) from None
    except OSError as exc:
        raise ZcnetError(f"cannot create state file {path}: {exc.strerror}", _WRITE_FIX) from None


def load_state(ifname: str, netns: str | None = None) -> JSONObject | None:
    """The state ``setup`` saved for ``ifname``, checked field by field (see ``_state_problem``),
    or None if there is none."""
    path = state_path(ifname, netns)
    damaged = (f"check {ifname} with 'zcnet nic show', put back by hand what setup changed, "
               f"then remove {path}")
    if file_in_the_way(path.parent) == path.parent:
        raise ZcnetError(f"the state directory {path.parent} is not a directory", _WRITE_FIX)
    if not os.path.lexists(path):
        return None
    try:
        doc: JSONValue = json.loads(read_text(path, "state file", limit=MAX_STATE,
                                              fix=damaged))
    except FileProblem as exc:   # not a regular file, too large, not UTF-8: damage, not usage
        raise ZcnetError(exc.message, exc.hint) from None
    except ValueError as exc:
        raise ZcnetError(f"state file {path} is not JSON ({exc})", damaged) from None
    except RecursionError:
        raise ZcnetError(f"state file {path} is not what setup writes (nested too deeply)",
                         damaged) from None
    if (why := _state_problem(_upgrade(doc), ifname, netns)) is not None \
            or not isinstance(doc, dict):
        raise ZcnetError(f"state file {path} is not what setup writes: {why}", damaged)
    return doc


def _upgrade(doc: JSONValue) -> JSONValue:
    """A version-1 state file (one queue, one port) in version 2's words, where its fields
    have the shape version 1 wrote; ``_state_problem`` then checks the result as any other."""
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return doc
    steps = doc["steps"] if isinstance(doc.get("steps"), list) else []
    records = [doc.get("config"), *(s.get("params") for s in steps if isinstance(s, dict)
                                    and s.get("kind") in ("rss", "rss-context"))]
    for record in records:
        for one in ("queue", "port"):
            if isinstance(record, dict) and one in record:
                record[f"{one}s"] = [record.pop(one)]
    doc["version"] = 2
    return doc


def _state_problem(doc: JSONValue, ifname: str, netns: str | None) -> str | None:
    """Why ``doc`` is not a state file of ``ifname`` in ``netns`` as setup writes it, or None:
    restore applies nothing it has not checked."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("version") != STATE_VERSION:
        return f"version {str(doc.get('version'))[:20]!r}, not {STATE_VERSION}"
    if "ifname" not in doc or "netns" not in doc:
        return "no ifname or netns"
    if doc["ifname"] != ifname or doc["netns"] != netns:
        return (f"it is for interface {str(doc['ifname'])[:20]!r} in namespace "
                f"{str(doc['netns'])[:20]!r}")
    if type(doc.get("ifindex")) is not int:
        return "no ifindex"
    cfg = doc.get("config")
    if not isinstance(cfg, dict) or not queue_list(cfg.get("queues")):
        return "config lacks its queues"
    if not port_list(cfg.get("ports")):
        return "config lacks its ports"
    if cfg.get("mode") not in MODES or type(cfg.get("rss_context")) is not bool:
        return "config lacks its mode or rss_context"
    flows = cfg.get("flows")
    if not isinstance(flows, list) or not all(f in ntuple.FLOW_TYPES for f in flows):
        return "config lacks its flow types"
    steps = doc.get("steps")
    if not isinstance(steps, list) or len(steps) > MAX_STEPS:
        return f"steps is not a list of at most {MAX_STEPS} steps"
    for i, step in enumerate(steps):
        where = f"steps[{i}]"
        if not isinstance(step, dict) or set(step) != {"kind", "params", "status", "undo"}:
            return f"{where} is not an object with kind, params, status and undo"
        if step["kind"] not in STEPS:
            return f"{where}.kind {str(step['kind'])[:40]!r} is no step setup takes"
        if step["status"] not in _STATUSES:
            return f"{where}.status {str(step['status'])[:40]!r} is not one of {_STATUSES}"
        if why := STEPS[step["kind"]].problem(step["params"], step["undo"], where):
            return why
    return None


# ------------------------------------------------------------------------------ apply/undo

Hook = Callable[[int, Step], None]


def _run_apply(dev: Device, steps: list[Step], step: Step) -> None:
    params = dict(step.params)
    if step.kind == "flow-rule" and params.get("context_step") is not None:
        params["context_of"] = steps[params["context_step"]].undo.get("context")
    STEPS[step.kind].apply(dev, params, step.undo)


def _undo_all(dev: Device, steps: list[Step], save: Callable[[], None]) -> list[str]:
    """Undo done (and half-done) steps in reverse; returns failures as text, keeps going."""
    failures = []
    for step in reversed(steps):
        if step.status not in ("done", "applying"):
            continue
        try:
            STEPS[step.kind].undo(dev, step.params, step.undo)
        except (ZcnetError, OSError) as exc:
            if step.status == "applying":
                log.info("undo of half-done step %s: %s", step.title, exc)
                step.status = "undone"
            else:
                failures.append(f"{step.title}: {exc}")
                continue
        step.status = "undone"
        try:
            save()
        except ZcnetError as exc:   # keep undoing: the device matters more than the record
            log.warning("%s", exc)
    return failures


def apply(cfg: NicConfig, *, steps: list[Step] | None = None, before_step: Hook | None = None,
          device: Device | None = None) -> list[Step]:
    """Apply ``cfg`` (or explicit ``steps``) as a transaction; returns the steps applied.

    ``before_step(i, step)`` runs as each step starts, after the state file marks it
    (tests inject faults and kills there)."""
    path = state_path(cfg.ifname, cfg.netns)
    _state_dir_ready()
    if load_state(cfg.ifname, cfg.netns) is not None:
        raise _already(cfg, path)
    with _maybe_open(cfg, device) as dev:
        todo = plan(dev, cfg) if steps is None else steps
        doc = _doc(cfg, dev.ifindex, todo)

        def save() -> None:
            doc["steps"] = [asdict(s) for s in todo]
            _write_state(path, doc)

        _claim(path, cfg)
        try:
            save()
        except ZcnetError:   # the claim alone would read as a damaged state file
            path.unlink(missing_ok=True)
            raise
        current: Step | None = None
        try:
            for i, step in enumerate(todo):
                current = step
                step.status = "applying"
                save()
                if before_step is not None:
                    before_step(i, step)
                _run_apply(dev, todo, step)
                step.status = "done"
                save()
        except (ZcnetError, OSError, KeyboardInterrupt) as exc:
            failures = _undo_all(dev, todo, save)
            undone = [s.title for s in todo if s.status == "undone" and s is not current]
            if failures:
                raise ZcnetError(
                    f"setup failed at '{current.title if current else '?'}' ({exc}) and undo "
                    f"failed: {'; '.join(failures)}",
                    f"state kept in {path}; fix the cause and run "
                    f"'zcnet nic restore {iface_args(cfg.ifname, cfg.netns)}'") from exc
            path.unlink(missing_ok=True)
            if isinstance(exc, KeyboardInterrupt):
                raise
            reason = exc.message if isinstance(exc, ZcnetError) else str(exc)
            raise SetupError(current.title if current else "?", reason, undone,
                             getattr(exc, "hint", None)) from exc
        return todo


def restore(ifname: str, netns: str | None = None, *, device: Device | None = None) -> list[str]:
    """Undo what ``apply`` did, from the state file; returns the titles of undone steps."""
    path = state_path(ifname, netns)
    doc = load_state(ifname, netns)
    if doc is None:
        raise ZcnetError(f"nothing to restore on {ifname}: no state file {path}",
                         f"'zcnet nic setup {iface_args(ifname, netns)} ...' writes it")
    steps = [Step(s["kind"], s["params"], s["status"], s["undo"]) for s in doc["steps"]]
    # Each undo is saved as it finishes: a file that cannot be rewritten is found now, before
    # anything on the device changes.
    _write_state(path, doc)
    cfg = _configured_by(doc)
    with _maybe_open(cfg, device) as dev:
        if dev.ifindex != doc.get("ifindex", dev.ifindex):
            log.warning("%s has ifindex %d now, %s when set up", ifname, dev.ifindex,
                        doc.get("ifindex"))

        def save() -> None:
            doc["steps"] = [asdict(s) for s in steps]
            _write_state(path, doc)

        todo = [s.title for s in reversed(steps) if s.status in ("done", "applying")]
        failures = _undo_all(dev, steps, save)
        if failures:
            raise ZcnetError(f"restore of {ifname} incomplete: {'; '.join(failures)}",
                             f"state kept in {path}; fix the cause and run restore again")
    path.unlink(missing_ok=True)
    return todo


def _configured_by(doc: JSONObject) -> NicConfig:
    """The configuration a checked state file (``load_state``) records."""
    c = doc["config"]
    return NicConfig(doc["ifname"], c["queues"], c["ports"], c["mode"], c["rss_context"],
                     doc["netns"], tuple(c["flows"]))


def configured(ifname: str, netns: str | None = None) -> NicConfig | None:
    """The configuration ``setup`` applied to ``ifname`` and has not restored (from its state
    file), or None: what a server checks its connections' queues against."""
    doc = load_state(ifname, netns)
    return None if doc is None else _configured_by(doc)


@contextmanager
def _maybe_open(cfg: NicConfig, device: Device | None) -> Iterator[Device]:
    if device is not None:
        yield device
        return
    with Device.open(cfg.ifname, cfg.netns) as dev:
        yield dev


@contextmanager
def applied(cfg: NicConfig) -> Iterator[list[Step]]:
    """Apply for the duration of a block (a bench run), restore afterwards, even on error."""
    steps = apply(cfg)
    try:
        yield steps
    finally:
        restore(cfg.ifname, cfg.netns)


__all__ = ["NicConfig", "SetupError", "Step", "applied", "apply", "configured", "plan",
           "restore", "state_path"]
