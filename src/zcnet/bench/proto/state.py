"""Which message may come next: the table ``TRANSITIONS`` of (state, sender, message) -> state.

One request is outstanding at a time and the server answers each; a request moves the
conversation into a state named after it, the reply back to ``ready``.
"""

from __future__ import annotations

from enum import Enum


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"


# States in which the client has not yet authenticated: the server takes only small frames.
PREAUTH_STATES = frozenset({"hello", "welcome", "auth", "auth_wait"})

# request -> reply
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
