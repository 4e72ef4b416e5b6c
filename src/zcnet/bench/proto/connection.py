"""One side of one control conversation, sans-I/O: bytes in, validated messages out.

Nothing here touches a socket (``zcnet.bench.proto.channel`` drives it over one). A server-role
connection also enforces the server's :class:`Limits` on what the client asks for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from zcnet.bench.proto.errors import LocalProtocolError, RemoteProtocolError
from zcnet.bench.proto.framing import NEED_DATA, Decoder, NeedData, encode
from zcnet.bench.proto.schema import MAX_MESSAGE, MAX_PREAUTH_MESSAGE, PROTOCOL_VERSION, validate
from zcnet.bench.proto.state import PREAUTH_STATES, TRANSITIONS, C, Role, S
from zcnet.rx.copying import UringMultishotEngine
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import ENGINES


@dataclass(frozen=True)
class Limits:
    """Bounds a server enforces per session (the client learns them from ``welcome``)."""

    max_duration: float = 3600.0
    max_flows: int = 256
    max_buffer: int = 64 << 20        # one read/write/request/response buffer
    max_memory: int = 1 << 30         # sum of all buffers of a session's flows

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)


_BUFFERS = {"open": ("read_size", "req_size", "resp_size"),
            "connect": ("write_size", "req_size", "resp_size")}
# Engine options that size memory the server allocates beyond read_size; their defaults and the
# sizing are EngineOptions'. A zero-copy engine always registers an area, uring-mshot always a
# provided-buffer ring; any engine is charged for one when the open names its options.
_AREA_OPTS = ("zc_area", "zc_buf")
_RING_OPTS = ("mshot_buf", "mshot_entries")
_ZERO_COPY = frozenset(name for name, info in ENGINES.items() if info.zero_copy)


def _sizing(opts: dict[str, Any]) -> EngineOptions:
    """The options that size memory, those of them the open gives as integers."""
    return EngineOptions(**{k: v for k in (*_AREA_OPTS, *_RING_OPTS)
                            if type(v := opts.get(k)) is int})


def buffer_sizes(msg: dict[str, Any]) -> list[int]:
    """The memory an open/connect asks the server to allocate, one entry per buffer."""
    sizes = [msg[k] for k in _BUFFERS[msg["type"]]]
    opts = msg.get("engine_opts") or {}
    engine = msg.get("engine")
    sizing = _sizing(opts)
    if engine in _ZERO_COPY or any(k in opts for k in _AREA_OPTS):
        sizes.append(max(0, sizing.area_bytes()))
    if engine == UringMultishotEngine.name or any(k in opts for k in _RING_OPTS):
        sizes.append(max(0, sizing.mshot_ring_bytes()))
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
