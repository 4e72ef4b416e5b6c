"""The client end of one control connection to a ``zcnet server``: blocking requests over the
protocol's :class:`~zcnet.bench.proto.Channel`, and the server's refusals as errors with hints."""

from __future__ import annotations

import contextlib
import socket

from zcnet.bench import proto
from zcnet.bench.authtoken import default_token, default_token_path
from zcnet.bench.endpoint import parse_hostport
from zcnet.bench.proto import UNSUPPORTED_HERE, Channel, Message, ProtocolError, Role, get
from zcnet.errors import ZcnetError
from zcnet.jsonvalue import JSONObject
from zcnet.netns import in_netns

REQUEST_TIMEOUT = 60.0
CLOSE_TIMEOUT = 5.0     # for the goodbye: a silent server must not hold up the exit


class Control:
    """The client end of one control connection: blocking requests over the sans-I/O protocol."""

    def __init__(self, addr: str, token: bytes | None, netns: str | None = None) -> None:
        """``token``: the server's secret; ``None`` reads this user's token file, which a
        ``zcnet server`` of the same user without ``--token-file`` uses too."""
        self.addr = addr
        host, port = parse_hostport(addr)
        key = token if token is not None else default_token(create=False)
        self.host = host
        self.conn = proto.Connection(Role.CLIENT)
        try:
            # A socket belongs to the namespace it was created in, whatever the thread does next.
            with in_netns(netns):
                self.sock = socket.create_connection((host, port), timeout=10)
        except OSError as e:
            raise ZcnetError(f"cannot reach zcnet server at {host}:{port}: {e.strerror or e}",
                             "start `zcnet server` there (or pass --ssh HOST)") from None
        self.sock.settimeout(REQUEST_TIMEOUT)
        self.chan = Channel(self.sock, self.conn)
        with contextlib.ExitStack() as undo:
            undo.callback(self.sock.close)   # unless the handshake completes
            self.send({"type": "hello", "version": proto.PROTOCOL_VERSION,
                       "caps": list(proto.CAPABILITIES)})
            welcome = self.receive(REQUEST_TIMEOUT)
            self.cpus = get(welcome, "cpus", int)
            self.limits: proto.Limits = self.conn.limits   # as the welcome said
            self.send({"type": "auth",
                       "mac": proto.auth_mac(key, get(welcome, "challenge", str))})
            details = self.receive(REQUEST_TIMEOUT).get("host")
            self.env: JSONObject = details if isinstance(details, dict) else {}
            undo.pop_all()

    def send(self, msg: Message) -> None:
        try:
            self.chan.send(msg)
        except OSError as e:
            raise ZcnetError(f"server {self.addr}: connection lost ({e})") from None

    def receive(self, timeout: float) -> Message:
        try:
            ev = self.chan.receive(timeout)
        except ProtocolError as e:
            raise ZcnetError(f"server {self.addr}: {e.message}") from None
        if ev is None:
            raise ZcnetError(f"server {self.addr}: no answer within {timeout:.0f} s")
        if ev["type"] == "error":
            raise _server_error(self.addr, ev)
        return ev

    def request(self, msg: Message) -> Message:
        self.send(msg)
        return self.receive(REQUEST_TIMEOUT)

    def close(self) -> None:
        """Say goodbye when the conversation allows it; close the socket in any case."""
        try:
            if self.conn.state in ("ready", "running"):
                self.sock.settimeout(CLOSE_TIMEOUT)
                self.send({"type": "end"})
                self.receive(CLOSE_TIMEOUT)
        except (ZcnetError, OSError, ProtocolError):
            pass
        finally:
            self.sock.close()


class ServerRefused(ZcnetError):
    """A server's error reply; ``code`` says why (auth, limit, unsupported, version, worker)."""

    def __init__(self, message: str, hint: str | None, *, code: str, reason: str) -> None:
        super().__init__(message, hint)
        self.code = code
        self.reason = reason

    @property
    def cause(self) -> str:
        """The reason without the engine prefix, for a table cell that already names it."""
        return self.reason.split(UNSUPPORTED_HERE, 1)[-1]


def _server_error(addr: str, ev: Message) -> ZcnetError:
    hints = {
        "auth": "use the same --token-file as the server (without one, both use the token "
                f"file of their user, {default_token_path()})",
        "busy": "wait for other sessions to end, or start another server",
        "limit": "ask for less (fewer flows, shorter run, smaller buffers) or raise the server's "
                 "limits",
        "unsupported": "pick an engine or tx path the server supports (the reason says what "
                       "is missing there)",
        "version": "run the same zcnet version on both ends",
    }
    code, message = get(ev, "code", str), get(ev, "message", str)
    return ServerRefused(f"server {addr} refused: {message}", hints.get(code), code=code,
                         reason=message)
