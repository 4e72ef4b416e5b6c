"""Where a zcnet server listens and with which token: address parsing and the checks that a
listener is safe to open. The client imports this, not the server."""

from __future__ import annotations

import ipaddress

from zcnet.bench.authtoken import MIN_TOKEN
from zcnet.bench.proto import DEFAULT_PORT
from zcnet.errors import UsageError

DEFAULT_LISTEN = ("127.0.0.1", DEFAULT_PORT)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host == "localhost"


def parse_hostport(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT``, ``[V6]:PORT`` or ``V6`` -> (host, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:
        host, port = text, ""
    try:
        number = int(port) if port else default_port
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:   # bind/connect would raise OverflowError, not OSError
        raise UsageError(f"bad port in {text!r}", "use HOST:PORT, e.g. 127.0.0.1:18323")
    return host, number


def check_listener(host: str, token: bytes | None) -> None:
    """Listening beyond loopback needs an explicit token; any token must be long enough."""
    if not is_loopback(host) and not token:
        raise UsageError(f"listening on {host} without a token would let anyone on the "
                         "network run workers", "pass --token-file FILE (same file for the "
                         "client), or listen on 127.0.0.1")
    if token is not None and len(token) < MIN_TOKEN:
        raise UsageError(f"a token of {len(token)} bytes is too short",
                         f"use at least {MIN_TOKEN} bytes of secret")
