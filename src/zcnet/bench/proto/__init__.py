"""Control protocol between ``zcnet client`` and ``zcnet server``.

Split as h11 splits HTTP: ``schema`` (the messages and their bounds), ``framing`` (bytes to
messages), ``state`` (which message may come next), ``auth`` (the challenge-response),
``limits`` (what a server allows a session, and the budget that holds a session to it),
``connection`` (one side of a conversation, sans-I/O) and ``channel`` (a connection over a
blocking socket, used by both ends).

Wire format: every frame is a 4-byte big-endian payload length, then that many bytes of UTF-8 JSON
holding one object with a ``"type"`` key. Payloads are bounded (``MAX_MESSAGE``).

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
"""

from __future__ import annotations

from zcnet.bench.proto.auth import CHALLENGE_BYTES, auth_mac, check_mac, new_challenge
from zcnet.bench.proto.channel import Channel
from zcnet.bench.proto.connection import Connection
from zcnet.bench.proto.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from zcnet.bench.proto.framing import HEADER, NEED_DATA, Decoder, NeedData, encode
from zcnet.bench.proto.limits import Budget, LimitExceeded, Limits, buffer_sizes
from zcnet.bench.proto.schema import (
    CAPABILITIES,
    CPU,
    DEFAULT_PORT,
    DURATION,
    FLOW,
    GRACE,
    MAX_MESSAGE,
    MAX_PREAUTH_MESSAGE,
    MAX_SIZE,
    MODES,
    PORT,
    PROTOCOL_VERSION,
    SCHEMA,
    SIZE,
    UNSUPPORTED_HERE,
    Field,
    Message,
    OptionValue,
    get,
    get_options,
    get_or,
    validate,
)
from zcnet.bench.proto.state import PREAUTH_STATES, REQUESTS, STATES, TRANSITIONS, Role

__all__ = [
    "CAPABILITIES", "CHALLENGE_BYTES", "CPU", "DEFAULT_PORT", "DURATION", "FLOW", "GRACE",
    "HEADER", "MAX_MESSAGE", "MAX_PREAUTH_MESSAGE", "MAX_SIZE", "MODES", "NEED_DATA", "PORT",
    "PREAUTH_STATES", "PROTOCOL_VERSION", "REQUESTS", "SCHEMA", "SIZE", "STATES",
    "TRANSITIONS", "UNSUPPORTED_HERE", "Budget", "Channel", "Connection", "Decoder", "Field",
    "LimitExceeded", "Limits", "LocalProtocolError", "Message", "NeedData", "OptionValue",
    "ProtocolError", "RemoteProtocolError", "Role", "auth_mac", "buffer_sizes", "check_mac",
    "encode", "get", "get_options", "get_or", "new_challenge", "validate",
]
