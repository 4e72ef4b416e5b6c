"""One side of one control conversation, sans-I/O: bytes in, validated messages out.

Nothing here touches a socket (``zcnet.bench.proto.channel`` drives it over one). A server-role
connection also enforces the server's :class:`Limits` on what the client asks for.
"""

from __future__ import annotations

from zcnet.bench.proto.errors import LocalProtocolError, RemoteProtocolError
from zcnet.bench.proto.framing import NEED_DATA, Decoder, NeedData, encode
from zcnet.bench.proto.limits import Budget, Limits
from zcnet.bench.proto.schema import (
    MAX_MESSAGE,
    MAX_PREAUTH_MESSAGE,
    PROTOCOL_VERSION,
    Message,
    get,
    validate,
)
from zcnet.bench.proto.state import PREAUTH_STATES, TRANSITIONS, C, Role, S


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
        self.budget = Budget(self.limits)   # what the session holds (kept on both sides)

    @property
    def closed(self) -> bool:
        return self.state == "closed"

    @property
    def flows(self) -> int:
        return self.budget.flows

    def send(self, msg: Message) -> bytes:
        kind = msg.get("type")
        if kind == "error":
            self.state = "closed"
            return encode(msg)
        if not isinstance(kind, str):
            raise LocalProtocolError("unknown", f"cannot send a message of type {kind!r}")
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

    def next_event(self) -> Message | NeedData:
        if self.closed:
            raise RemoteProtocolError("closed", "connection already closed")
        preauth = self.role is S and self.state in PREAUTH_STATES
        msg = self._decoder.next(MAX_PREAUTH_MESSAGE if preauth else MAX_MESSAGE)
        if isinstance(msg, NeedData):
            if self.eof:
                was, self.state = self.state, "closed"
                raise RemoteProtocolError("eof", f"peer closed the connection in state {was}")
            return NEED_DATA
        kind = get(msg, "type", str)
        if kind == "error":
            self.state = "closed"
            return msg
        key = (self.state, self.peer, kind)
        if key not in TRANSITIONS:
            raise RemoteProtocolError("unexpected", f"{kind} not allowed in state {self.state}")
        if self.role is S:
            self._enforce(msg)
        elif kind == "welcome":   # what this server allows a session, from now on
            self.limits = Limits.from_wire(msg["limits"])
            self.budget = Budget(self.limits)
        self._after(msg)
        self.state = TRANSITIONS[key]
        return msg

    # -- bookkeeping of what the server has granted ----------------------------------------------

    def _enforce(self, msg: Message) -> None:
        if msg["type"] == "hello" and msg["version"] != PROTOCOL_VERSION:
            raise RemoteProtocolError(
                "version", f"client speaks version {msg['version']}, server {PROTOCOL_VERSION}")
        self.budget.check(msg)

    def _after(self, msg: Message) -> None:
        self.budget.record(msg)
