"""Which fields each message has, and their bounds: the table ``SCHEMA``.

Everything a peer sends is checked against it (``validate``); anything outside raises
:class:`RemoteProtocolError` carrying the ``error`` code to reply with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

from zcnet.bench.proto.errors import RemoteProtocolError
from zcnet.bench.records import CpuShares, FlowEnd, RecordError, parse_as
from zcnet.jsonvalue import JSONObject, JSONValue

# 2: a flow's results are zcnet.bench.records.FlowEnd (status and reason, cpu_end, syscalls).
PROTOCOL_VERSION = 2
DEFAULT_PORT = 18323
MAX_MESSAGE = 1 << 20
# What an unauthenticated peer may send in one frame (a hello or an auth is a few hundred
# bytes): a server holding many half-open handshakes then holds little memory for each.
MAX_PREAUTH_MESSAGE = 4096
# How long after a run's duration a server may take to drain and send its results.
GRACE = 10.0
# An "unsupported" reason names the engine, then this, then the host's own reason; the client
# shows the host's reason alone where the engine is already named.
UNSUPPORTED_HERE = " unsupported here: "
# What an engine option may hold on the wire (and in the client's and bench's options).
OptionValue = bool | int | str
# A message: a JSON object with a "type", whose fields ``validate`` checked against ``SCHEMA``.
Message: TypeAlias = JSONObject
CAPABILITIES = ("stream", "rr", "tcp_info", "cpu_stats", "pin", "hist")

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HOST = re.compile(r"[0-9A-Za-z:.%_-]{1,255}\Z")
_OPTION_WORD = re.compile(r"[0-9A-Za-z:.%_,-]{1,255}\Z")   # eth1, fe80::1%eth1, 1,2


@dataclass(frozen=True)
class Field:
    """One field of a message: its Python type, whether it must be there, and its bounds."""

    kind: type | tuple[type, ...]
    required: bool = True
    lo: float | None = None
    hi: float | None = None
    pattern: re.Pattern[str] | None = None
    choices: tuple[str, ...] | None = None
    nullable: bool = False
    check: Callable[[JSONValue], bool] | None = field(default=None, compare=False)


def _int(lo: int, hi: int, required: bool = True) -> Field:
    return Field(int, required, lo, hi)


FLOW = _int(0, 1 << 16)
PORT = _int(1, 65535)
CPU = _int(0, 1 << 16)
MAX_SIZE = 1 << 40        # one buffer; further bounded by Limits.max_buffer at the server
DURATION = (0.01, 1e6)    # a run's seconds (start.duration); the client checks it up front
SIZE = _int(1, MAX_SIZE)
MODES = ("stream", "rr")


def _str_list(v: JSONValue) -> bool:
    return isinstance(v, list) and len(v) <= 32 and all(isinstance(s, str) and _NAME.match(s)
                                                        for s in v)


def _json_obj(v: JSONValue) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) for k in v)


def _record_check(tp: object, where: str) -> Callable[[JSONValue], bool]:
    """A check that ``tp`` (a record, a list of them ...) can hold the value: the results a
    server sends are read as the client's records, every field typed and in its range."""
    def check(v: JSONValue) -> bool:
        try:
            parse_as(tp, v, where)
        except RecordError as e:
            raise RemoteProtocolError("invalid", f"results.{e}") from None
        return True

    return check


# A welcome's limits (``limits.Limits`` on the wire): all four, within the ranges a server can be
# given; keys beyond them are a newer server's and ignored.
LIMITS: dict[str, Field] = {
    "max_duration": Field(float, lo=0.01, hi=1e6),
    "max_flows": _int(1, 1 << 16),
    "max_buffer": SIZE,
    "max_memory": SIZE,
}


def _limits(v: JSONValue) -> bool:
    if not isinstance(v, dict) or not _json_obj(v):
        return False
    for name, f in LIMITS.items():
        if name not in v:
            raise RemoteProtocolError("invalid", f"welcome.limits: missing {name!r}")
        _check("welcome.limits", name, f, v[name])
    return True


def _engine_opts(v: JSONValue) -> bool:
    """Engine options (ifname, queue, consumer ...): a few names with plain scalar values."""
    def ok(x: JSONValue) -> bool:
        if isinstance(x, bool):
            return True
        if isinstance(x, int):
            return -(1 << 40) <= x <= 1 << 40
        return isinstance(x, str) and _OPTION_WORD.match(x) is not None

    return isinstance(v, dict) and len(v) <= 16 and all(
        isinstance(k, str) and _NAME.match(k) and ok(x) for k, x in v.items())


SCHEMA: dict[str, dict[str, Field]] = {
    "hello": {"version": _int(0, 1 << 16), "caps": Field(list, check=_str_list)},
    "welcome": {
        "version": _int(0, 1 << 16),
        "caps": Field(list, check=_str_list),
        "challenge": Field(str, pattern=_HEX64),
        "cpus": _int(1, 1 << 16),
        "limits": Field(dict, check=_limits),
    },
    "auth": {"mac": Field(str, pattern=_HEX64)},
    # What the server runs on (kernel, CPU model, hostname ...): results carry both hosts'.
    # Only an authenticated client learns them (no kernel release for a port scanner).
    "auth_ok": {"host": Field(dict, required=False, check=_json_obj)},
    "open": {
        "flow": FLOW,
        "mode": Field(str, choices=MODES),
        "engine": Field(str, pattern=_NAME),
        "read_size": SIZE,
        "req_size": SIZE,
        "resp_size": SIZE,
        "engine_opts": Field(dict, required=False, check=_engine_opts),
        "verify": Field(bool, required=False),
        # Listen on this port (one a NIC flow rule steers to a queue) instead of any free one.
        "port": _int(1, 65535, required=False),
    },
    "opened": {"flow": FLOW, "port": PORT, "pid": _int(1, 1 << 31)},
    "connect": {
        "flow": FLOW,
        "host": Field(str, pattern=_HOST),
        "port": PORT,
        "mode": Field(str, choices=MODES),
        "tx": Field(str, pattern=_NAME),
        "write_size": SIZE,
        "req_size": SIZE,
        "resp_size": SIZE,
        "verify": Field(bool, required=False),
    },
    "connected": {"flow": FLOW, "pid": _int(1, 1 << 31), "cpu": Field(int, lo=-1, hi=1 << 16),
                  "local_port": PORT},
    "probe": {"flow": FLOW},
    "probed": {"flow": FLOW, "cpu": Field(int, lo=-1, hi=1 << 16)},
    # role: pin only that end of the flow (both ends live in one session when src == dst).
    "pin": {"flow": FLOW, "cpu": CPU, "role": Field(str, required=False, choices=("rx", "tx"))},
    "pinned": {"flow": FLOW, "cpu": CPU},
    "close": {"flow": FLOW},
    "closed": {"flow": FLOW},
    "start": {"duration": Field(float, lo=DURATION[0], hi=DURATION[1])},
    # hist: the session's latency histograms merged into one (HDR, base64), so a results message
    # stays far below MAX_MESSAGE however many flows ran (one encoded histogram is ~10 KiB).
    "results": {"flows": Field(list, check=_record_check(list[FlowEnd], "flows")),
                "cpus": Field(dict, check=_record_check(dict[str, CpuShares], "cpus")),
                "seconds": Field(float, lo=0.0, hi=1e7),
                "hist": Field(str, required=False,
                              check=lambda s: isinstance(s, str) and len(s) < MAX_MESSAGE // 2)},
    "end": {},
    "bye": {},
    "error": {"code": Field(str, pattern=_NAME),
              "message": Field(str, check=lambda s: isinstance(s, str) and len(s) < 4096)},
}


def validate(msg: object) -> Message:
    """Check one decoded message against ``SCHEMA``; return it with floats normalized."""
    if not isinstance(msg, dict):
        raise RemoteProtocolError("malformed", "message is not a JSON object")
    kind = msg.get("type")
    if not isinstance(kind, str) or kind not in SCHEMA:
        raise RemoteProtocolError("unknown", f"unknown message type {str(kind)[:40]!r}")
    spec = SCHEMA[kind]
    extra = set(msg) - set(spec) - {"type"}
    if extra:
        raise RemoteProtocolError("invalid", f"{kind}: unexpected fields {sorted(extra)[:8]}")
    out: Message = {"type": kind}
    for name, f in spec.items():
        if name not in msg:
            if f.required:
                raise RemoteProtocolError("invalid", f"{kind}: missing field {name!r}")
            continue
        out[name] = _check(kind, name, f, msg[name])
    return out


def _check(kind: str, name: str, f: Field, value: JSONValue) -> JSONValue:
    where = f"{kind}.{name}"
    if value is None and f.nullable:
        return None
    if f.kind is bool:
        if not isinstance(value, bool):
            raise RemoteProtocolError("invalid", f"{where}: wrong type {type(value).__name__}")
        return value
    # bool is an int in Python, never a valid number on this wire.
    if isinstance(value, bool) or not isinstance(value, (int, float) if f.kind is float
                                                 else f.kind):
        raise RemoteProtocolError("invalid", f"{where}: wrong type {type(value).__name__}")
    if f.kind is float and isinstance(value, (int, float)):
        try:
            value = float(value)
        except OverflowError:   # an integer literal of hundreds of digits
            raise RemoteProtocolError("invalid", f"{where}: not a finite number") from None
        if not math.isfinite(value):
            raise RemoteProtocolError("invalid", f"{where}: not a finite number")
    if isinstance(value, (int, float)) and ((f.lo is not None and value < f.lo)
                                            or (f.hi is not None and value > f.hi)):
        raise RemoteProtocolError("invalid", f"{where}: {value} outside [{f.lo}, {f.hi}]")
    if f.pattern is not None and isinstance(value, str) and not f.pattern.match(value):
        raise RemoteProtocolError("invalid", f"{where}: malformed value")
    if f.choices is not None and value not in f.choices:
        raise RemoteProtocolError("invalid", f"{where}: not one of {list(f.choices)}")
    if f.check is not None and not f.check(value):
        raise RemoteProtocolError("invalid", f"{where}: invalid value")
    return value


# ---- reading fields of a validated message ----------------------------------------------------

T = TypeVar("T", int, float, str, bool)


def get(msg: Message, name: str, kind: type[T]) -> T:
    """Field ``name`` of a message ``validate`` checked: of ``kind``, as ``SCHEMA`` says (a
    TypeError is a bug on our side, never a peer's doing)."""
    value = msg[name]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)  # a whole number where the schema allows any
    if not isinstance(value, kind):
        raise TypeError(f"{msg.get('type')}.{name} is {type(value).__name__}, not {kind.__name__}")
    return value


def get_or(msg: Message, name: str, default: T) -> T:
    """An optional field, or ``default`` where the message leaves it out."""
    return get(msg, name, type(default)) if name in msg else default


def get_options(msg: Message) -> dict[str, OptionValue]:
    """An open's engine options (``_engine_opts`` checked them), or none."""
    opts = msg.get("engine_opts") or {}
    if not isinstance(opts, dict):
        raise TypeError(f"{msg.get('type')}.engine_opts is {type(opts).__name__}")
    return {k: v for k, v in opts.items() if isinstance(v, (bool, int, str))}
