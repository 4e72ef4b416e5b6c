"""Control protocol between ``zcnet client`` and ``zcnet server``, sans-I/O.

Nothing here touches a socket: a :class:`Connection` takes bytes in (``receive_data``) and gives
messages out (``next_event``), and turns messages to send into bytes (``send``). The server and the
client drive it over whatever transport they have; tests drive it with plain bytes.

Wire format: every frame is a 4-byte big-endian payload length, then that many bytes of UTF-8 JSON
holding one object with a ``"type"`` key. Payloads are bounded (``MAX_MESSAGE``); a frame that
announces more is refused before any of it is buffered.

Conversation (one outstanding request at a time, the server answers each):

    client                     server
    hello {version, caps}  ->
                           <-  welcome {version, caps, challenge, cpus, limits}
    auth {mac}             ->                      mac = HMAC-SHA256(token, challenge)
                           <-  auth_ok {host}
    open {flow, ...}       ->  (spawn a receiving worker, listening)
                           <-  opened {flow, port, pid}
    connect {flow, ...}    ->  (spawn a sending worker, connected to host:port)
                           <-  connected {flow, pid, cpu, local_port}
    probe {flow}           ->  (wait for the receiving worker's accept)
                           <-  probed {flow, cpu}
    pin {flow, cpu}        ->  <-  pinned {flow, cpu}
    close {flow}           ->  <-  closed {flow}
    start {duration}       ->  ... the workers run ...
                           <-  results {flows, cpus}     (the run ends every open flow)
    end                    ->  <-  bye

Every server has a token (the per-user default of ``zcnet.bench.authtoken`` when none is given)
and accepts only the right MAC, compared in constant time; before authentication a peer may send
frames of at most ``MAX_PREAUTH_MESSAGE`` bytes. Either side may send
``error {code, message}`` at any point; the conversation is then over.

Which message may come next is the table ``TRANSITIONS``; which fields a message has and their
bounds is the table ``SCHEMA``. Everything a peer sends is checked against both, and anything
outside them raises :class:`RemoteProtocolError` carrying the ``error`` code to reply with.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import secrets
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

PROTOCOL_VERSION = 1
DEFAULT_PORT = 18323
MAX_MESSAGE = 1 << 20
# What an unauthenticated peer may send in one frame (a hello or an auth is a few hundred
# bytes): a server holding many half-open handshakes then holds little memory for each.
MAX_PREAUTH_MESSAGE = 4096
PREAUTH_STATES = frozenset({"hello", "welcome", "auth", "auth_wait"})
HEADER = struct.Struct("!I")
CAPABILITIES = ("stream", "rr", "tcp_info", "cpu_stats", "pin", "hist")
CHALLENGE_BYTES = 32


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"


class ProtocolError(Exception):
    """The conversation broke a rule. ``code`` is what goes into the error message's code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RemoteProtocolError(ProtocolError):
    """The peer sent something invalid: reply with ``error`` and close."""


class LocalProtocolError(ProtocolError):
    """We tried to send something the protocol does not allow now: a bug on our side."""


class NeedData(Enum):
    NEED_DATA = "need_data"


NEED_DATA = NeedData.NEED_DATA


@dataclass(frozen=True)
class Limits:
    """Bounds a server enforces per session (the client learns them from ``welcome``)."""

    max_duration: float = 3600.0
    max_flows: int = 256
    max_buffer: int = 64 << 20        # one read/write/request/response buffer
    max_memory: int = 1 << 30         # sum of all buffers of a session's flows

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


# ---- schema -------------------------------------------------------------------------------------

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HOST = re.compile(r"[0-9A-Za-z:.%_-]{1,255}\Z")


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
    check: Callable[[Any], bool] | None = field(default=None, compare=False)


def _int(lo: int, hi: int, required: bool = True) -> Field:
    return Field(int, required, lo, hi)


FLOW = _int(0, 1 << 16)
PORT = _int(1, 65535)
CPU = _int(0, 1 << 16)
SIZE = _int(1, 1 << 40)   # further bounded by Limits.max_buffer at the server
MODES = ("stream", "rr")


def _str_list(v: Any) -> bool:
    return len(v) <= 32 and all(isinstance(s, str) and _NAME.match(s) for s in v)


def _json_obj(v: Any) -> bool:
    return all(isinstance(k, str) for k in v)


def _result_flows(v: Any) -> bool:
    """What the client indexes a flow result by: an object with an int flow (and a str role)."""
    return all(isinstance(f, dict) and type(f.get("flow")) is int
               and isinstance(f.get("role", ""), str) for f in v)


def _cpu_shares(v: Any) -> bool:
    return all(isinstance(k, str) and isinstance(x, dict) for k, x in v.items())


def _engine_opts(v: Any) -> bool:
    """Engine options (ifname, queue, consumer ...): a few names with plain scalar values."""
    def ok(x: Any) -> bool:
        if isinstance(x, bool):
            return True
        if isinstance(x, int):
            return -(1 << 40) <= x <= 1 << 40
        return isinstance(x, str) and _HOST.match(x) is not None

    return len(v) <= 16 and all(isinstance(k, str) and _NAME.match(k) and ok(x)
                                for k, x in v.items())


SCHEMA: dict[str, dict[str, Field]] = {
    "hello": {"version": _int(0, 1 << 16), "caps": Field(list, check=_str_list)},
    "welcome": {
        "version": _int(0, 1 << 16),
        "caps": Field(list, check=_str_list),
        "challenge": Field(str, pattern=_HEX64),
        "cpus": _int(1, 1 << 16),
        "limits": Field(dict, check=_json_obj),
        # Older servers sent their host details here, before authentication; now in auth_ok.
        "host": Field(dict, required=False, check=_json_obj),
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
    "start": {"duration": Field(float, lo=0.01, hi=1e6)},
    # hist: the session's latency histograms merged into one (HDR, base64), so a results message
    # stays far below MAX_MESSAGE however many flows ran (one encoded histogram is ~10 KiB).
    "results": {"flows": Field(list, check=_result_flows), "cpus": Field(dict, check=_cpu_shares),
                "seconds": Field(float, lo=0.0, hi=1e7),
                "hist": Field(str, required=False, check=lambda s: len(s) < MAX_MESSAGE // 2)},
    "end": {},
    "bye": {},
    "error": {"code": Field(str, pattern=_NAME),
              "message": Field(str, check=lambda s: len(s) < 4096)},
}

# request -> reply; a request moves the connection into a state named after it, the reply back.
REQUESTS: dict[str, str] = {
    "open": "opened",
    "connect": "connected",
    "probe": "probed",
    "pin": "pinned",
    "close": "closed",
}

C, S = Role.CLIENT, Role.SERVER


def _transitions() -> dict[tuple[str, Role, str], str]:
    t = {
        ("hello", C, "hello"): "welcome",
        ("welcome", S, "welcome"): "auth",
        ("auth", C, "auth"): "auth_wait",
        ("auth_wait", S, "auth_ok"): "ready",
        ("ready", C, "start"): "running",
        ("running", S, "results"): "ready",
        ("ready", C, "end"): "ending",
        ("running", C, "end"): "ending",     # abort a run
        ("ending", S, "bye"): "closed",
    }
    for request, reply in REQUESTS.items():
        t[("ready", C, request)] = request
        t[(request, S, reply)] = "ready"
    return t


TRANSITIONS = _transitions()
STATES = frozenset({s for s, _, _ in TRANSITIONS} | set(TRANSITIONS.values()) | {"closed"})


def validate(msg: Any) -> dict[str, Any]:
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
    out: dict[str, Any] = {"type": kind}
    for name, f in spec.items():
        if name not in msg:
            if f.required:
                raise RemoteProtocolError("invalid", f"{kind}: missing field {name!r}")
            continue
        out[name] = _check(kind, name, f, msg[name])
    return out


def _check(kind: str, name: str, f: Field, value: Any) -> Any:
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
    if f.kind is float:
        try:
            value = float(value)
        except OverflowError:   # an integer literal of hundreds of digits
            raise RemoteProtocolError("invalid", f"{where}: not a finite number") from None
        if not math.isfinite(value):
            raise RemoteProtocolError("invalid", f"{where}: not a finite number")
    if (f.lo is not None and value < f.lo) or (f.hi is not None and value > f.hi):
        raise RemoteProtocolError("invalid", f"{where}: {value} outside [{f.lo}, {f.hi}]")
    if f.pattern is not None and not f.pattern.match(value):
        raise RemoteProtocolError("invalid", f"{where}: malformed value")
    if f.choices is not None and value not in f.choices:
        raise RemoteProtocolError("invalid", f"{where}: not one of {list(f.choices)}")
    if f.check is not None and not f.check(value):
        raise RemoteProtocolError("invalid", f"{where}: invalid value")
    return value


# ---- framing ------------------------------------------------------------------------------------

def encode(msg: dict[str, Any]) -> bytes:
    payload = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    if len(payload) > MAX_MESSAGE:
        raise LocalProtocolError("too_big", f"{msg.get('type')}: {len(payload)} bytes")
    return HEADER.pack(len(payload)) + payload


class Decoder:
    """Reassembles frames from a byte stream; yields validated messages."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    @property
    def pending(self) -> int:
        return len(self._buf)

    def next(self, max_message: int = MAX_MESSAGE) -> dict[str, Any] | NeedData:
        if len(self._buf) < HEADER.size:
            return NEED_DATA
        (length,) = HEADER.unpack_from(self._buf)
        if length > max_message:
            raise RemoteProtocolError("too_big", f"frame of {length} bytes > {max_message}")
        if len(self._buf) < HEADER.size + length:
            return NEED_DATA
        payload = bytes(self._buf[HEADER.size : HEADER.size + length])
        del self._buf[: HEADER.size + length]
        try:
            msg = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RemoteProtocolError("malformed", f"bad JSON: {str(exc)[:80]}") from None
        return validate(msg)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# ---- auth ---------------------------------------------------------------------------------------

def new_challenge() -> str:
    return secrets.token_hex(CHALLENGE_BYTES)


def auth_mac(token: bytes, challenge: str) -> str:
    return hmac.new(token, b"zcnet-auth-v1:" + challenge.encode(), hashlib.sha256).hexdigest()


def check_mac(token: bytes, challenge: str, mac: str) -> bool:
    return hmac.compare_digest(auth_mac(token, challenge).encode(), mac.encode())


# ---- the state machine --------------------------------------------------------------------------

_BUFFERS = {"open": ("read_size", "req_size", "resp_size"),
            "connect": ("write_size", "req_size", "resp_size")}
# Engine options that size memory the server allocates (a zero-copy area, provided buffers).
def _int_opt(opts: dict[str, Any], key: str, default: int) -> int:
    v = opts.get(key, default)
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _zc_area(o: dict[str, Any]) -> int:
    return _int_opt(o, "zc_area", 0) or 16 * (_int_opt(o, "zc_buf", 0) or 1 << 20)


def _mshot_ring(o: dict[str, Any]) -> int:
    return _int_opt(o, "mshot_buf", 64 << 10) * _int_opt(o, "mshot_entries", 256)


# (options, engines, size): memory an engine allocates beyond read_size, counted when the open
# names one of the options or one of the engines (which then allocate it even with no options).
# Defaults are EngineOptions' and the zero-copy providers' (1 MiB buffers, areas of 16).
_Sizer = Callable[[dict[str, Any]], int]
_OPT_MEMORY: tuple[tuple[tuple[str, ...], tuple[str, ...], _Sizer], ...] = (
    (("zc_area", "zc_buf"), ("soft-zc", "zcrx", "devmem"), _zc_area),
    (("mshot_buf", "mshot_entries"), ("uring-mshot",), _mshot_ring),
)


def buffer_sizes(msg: dict[str, Any]) -> list[int]:
    """The memory an open/connect asks the server to allocate, one entry per buffer."""
    sizes = [msg[k] for k in _BUFFERS[msg["type"]]]
    opts = msg.get("engine_opts") or {}
    engine = msg.get("engine")
    sizes += [max(0, size(opts)) for keys, engines, size in _OPT_MEMORY
              if engine in engines or any(k in opts for k in keys)]
    return sizes


class Connection:
    """One side of one control conversation.

    ``send(msg)`` returns the bytes to write; ``receive_data(b)`` buffers what was read (``b""``
    for end of stream); ``next_event()`` returns the next validated message, ``NEED_DATA``, or
    raises :class:`RemoteProtocolError`. A server-role connection also enforces ``limits`` on what
    the client asks for (flow count, buffer sizes, total memory, duration).
    """

    def __init__(self, role: Role, limits: Limits | None = None) -> None:
        self.role = role
        self.peer = S if role is C else C
        self.limits = limits or Limits()
        self.state = "hello"
        self.eof = False
        self._decoder = Decoder()
        self._memory: dict[tuple[str, int], int] = {}    # (kind, flow) -> bytes of buffers

    @property
    def closed(self) -> bool:
        return self.state == "closed"

    @property
    def flows(self) -> int:
        return len({flow for _, flow in self._memory})

    def send(self, msg: dict[str, Any]) -> bytes:
        kind = msg.get("type")
        if kind == "error":
            self.state = "closed"
            return encode(msg)
        if self.closed:
            raise LocalProtocolError("closed", f"cannot send {kind}: connection closed")
        key = (self.state, self.role, kind)
        if key not in TRANSITIONS:
            raise LocalProtocolError("unexpected", f"cannot send {kind} in state {self.state}")
        try:
            checked = validate(msg)
        except RemoteProtocolError as exc:
            raise LocalProtocolError(exc.code, exc.message) from None
        wire = encode(checked)   # may refuse (too big): then nothing has changed
        self._after(checked)
        self.state = TRANSITIONS[key]
        return wire

    def send_error(self, code: str, message: str) -> bytes:
        return self.send({"type": "error", "code": code, "message": message[:4000]})

    def receive_data(self, data: bytes) -> None:
        if data:
            self._decoder.feed(data)
        else:
            self.eof = True

    def next_event(self) -> dict[str, Any] | NeedData:
        if self.closed:
            raise RemoteProtocolError("closed", "connection already closed")
        preauth = self.role is S and self.state in PREAUTH_STATES
        msg = self._decoder.next(MAX_PREAUTH_MESSAGE if preauth else MAX_MESSAGE)
        if msg is NEED_DATA:
            if self.eof:
                was, self.state = self.state, "closed"
                raise RemoteProtocolError("eof", f"peer closed the connection in state {was}")
            return NEED_DATA
        assert isinstance(msg, dict)
        kind = msg["type"]
        if kind == "error":
            self.state = "closed"
            return msg
        key = (self.state, self.peer, kind)
        if key not in TRANSITIONS:
            raise RemoteProtocolError("unexpected", f"{kind} not allowed in state {self.state}")
        if self.role is S:
            self._enforce(msg)
        self._after(msg)
        self.state = TRANSITIONS[key]
        return msg

    # -- bookkeeping of what the server has granted ----------------------------------------------

    def _enforce(self, msg: dict[str, Any]) -> None:
        kind, lim = msg["type"], self.limits
        if kind == "hello" and msg["version"] != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                "version", f"client speaks version {msg['version']}, server {PROTOCOL_VERSION}")
        if kind == "start" and msg["duration"] > lim.max_duration:
            raise RemoteProtocolError("limit", f"duration {msg['duration']} > {lim.max_duration}")
        if kind in _BUFFERS:
            flow = msg["flow"]
            if (kind, flow) in self._memory:
                raise RemoteProtocolError("invalid", f"{kind}: flow {flow} already exists")
            if flow not in {f for _, f in self._memory} and self.flows >= lim.max_flows:
                raise RemoteProtocolError("limit", f"more than {lim.max_flows} flows")
            sizes = buffer_sizes(msg)
            if max(sizes) > lim.max_buffer:
                raise RemoteProtocolError("limit", f"buffer {max(sizes)} > {lim.max_buffer}")
            if sum(self._memory.values()) + sum(sizes) > lim.max_memory:
                raise RemoteProtocolError("limit", f"session memory > {lim.max_memory}")

    def _after(self, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind in _BUFFERS:
            self._memory[(kind, msg["flow"])] = sum(buffer_sizes(msg))
        elif kind == "close":
            for k in _BUFFERS:
                self._memory.pop((k, msg["flow"]), None)
        elif kind == "results":
            # A run ends every flow of the session (the server stops their workers).
            self._memory.clear()
