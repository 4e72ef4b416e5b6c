"""What a server allows one session, and the bookkeeping that holds a session to it.

The server sends its :class:`Limits` in ``welcome``; a :class:`Budget` charges each open and
connect against them. The server's connection refuses a request that would overdraw it, and a
client runs the same budget over the requests a whole run will make before it sends the first,
so that a run the server would refuse half-way is refused before any flow starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from zcnet.bench.proto.errors import RemoteProtocolError
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

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Limits:
        """The limits of a ``welcome`` (the schema has checked their types and ranges)."""
        return cls(max_duration=float(wire["max_duration"]), max_flows=wire["max_flows"],
                   max_buffer=wire["max_buffer"], max_memory=wire["max_memory"])


class LimitExceeded(RemoteProtocolError):
    """A request beyond one of the server's limits: ``limit`` names the ``Limits`` field,
    ``asked`` what the request (with the session so far) needs, ``allowed`` the bound."""

    def __init__(self, limit: str, asked: float, allowed: float, message: str) -> None:
        super().__init__("limit", message)
        self.limit, self.asked, self.allowed = limit, asked, allowed


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


class Budget:
    """What one session holds against ``limits``: buffers per (request kind, flow)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._memory: dict[tuple[str, int], int] = {}    # (kind, flow) -> bytes of buffers

    @property
    def flows(self) -> int:
        return len({flow for _, flow in self._memory})

    def check(self, msg: dict[str, Any]) -> None:
        """Raise :class:`LimitExceeded` (or ``invalid`` for a flow opened twice) unless the
        session may make request ``msg`` now."""
        kind, lim = msg["type"], self.limits
        if kind == "start" and msg["duration"] > lim.max_duration:
            raise LimitExceeded("max_duration", msg["duration"], lim.max_duration,
                                f"duration {msg['duration']} > {lim.max_duration}")
        if kind not in _BUFFERS:
            return
        flow = msg["flow"]
        if (kind, flow) in self._memory:
            raise RemoteProtocolError("invalid", f"{kind}: flow {flow} already exists")
        if flow not in {f for _, f in self._memory} and self.flows >= lim.max_flows:
            raise LimitExceeded("max_flows", self.flows + 1, lim.max_flows,
                                f"more than {lim.max_flows} flows")
        sizes = buffer_sizes(msg)
        if max(sizes) > lim.max_buffer:
            raise LimitExceeded("max_buffer", max(sizes), lim.max_buffer,
                                f"buffer {max(sizes)} > {lim.max_buffer}")
        total = sum(self._memory.values()) + sum(sizes)
        if total > lim.max_memory:
            raise LimitExceeded("max_memory", total, lim.max_memory,
                                f"session memory > {lim.max_memory}")

    def record(self, msg: dict[str, Any]) -> None:
        """Account for ``msg``, sent or received (a granted open, a close, a run's end)."""
        kind = msg["type"]
        if kind in _BUFFERS:
            self._memory[(kind, msg["flow"])] = sum(buffer_sizes(msg))
        elif kind == "close":
            for k in _BUFFERS:
                self._memory.pop((k, msg["flow"]), None)
        elif kind == "results":
            # A run ends every flow of the session (the server stops their workers).
            self._memory.clear()
