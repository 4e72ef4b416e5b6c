"""What a server allows one session, and the bookkeeping that holds a session to it.

The server sends its :class:`Limits` in ``welcome``; a :class:`Budget` charges each open and
connect against them. The server's connection refuses a request that would overdraw it, and a
client runs the same budget over the requests a whole run will make before it sends the first,
so that a run the server would refuse half-way is refused before any flow starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from zcnet.bench.proto.errors import RemoteProtocolError
from zcnet.bench.proto.schema import Message, OptionValue, get, get_options
from zcnet.jsonvalue import JSONObject, JSONValue
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

    def to_wire(self) -> JSONObject:
        return {"max_duration": self.max_duration, "max_flows": self.max_flows,
                "max_buffer": self.max_buffer, "max_memory": self.max_memory}

    @classmethod
    def from_wire(cls, wire: JSONValue) -> Limits:
        """The limits of a ``welcome`` (the schema has checked their types and ranges)."""
        if not isinstance(wire, dict):
            raise TypeError("welcome.limits is not an object")
        return cls(max_duration=get(wire, "max_duration", float),
                   max_flows=get(wire, "max_flows", int),
                   max_buffer=get(wire, "max_buffer", int),
                   max_memory=get(wire, "max_memory", int))


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


def _sizing(opts: dict[str, OptionValue]) -> EngineOptions:
    """The options that size memory, those of them the open gives as integers."""
    default = EngineOptions()

    def given(name: str, otherwise: int) -> int:
        value = opts.get(name)
        return value if type(value) is int else otherwise

    return EngineOptions(zc_area=given("zc_area", default.zc_area),
                         zc_buf=given("zc_buf", default.zc_buf),
                         mshot_buf=given("mshot_buf", default.mshot_buf),
                         mshot_entries=given("mshot_entries", default.mshot_entries))


def buffer_sizes(msg: Message) -> list[int]:
    """The memory an open/connect asks the server to allocate, one entry per buffer."""
    sizes = [get(msg, k, int) for k in _BUFFERS[get(msg, "type", str)]]
    opts = get_options(msg)
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

    def check(self, msg: Message) -> None:
        """Raise :class:`LimitExceeded` (or ``invalid`` for a flow opened twice) unless the
        session may make request ``msg`` now."""
        kind, lim = get(msg, "type", str), self.limits
        if kind == "start" and (duration := get(msg, "duration", float)) > lim.max_duration:
            raise LimitExceeded("max_duration", duration, lim.max_duration,
                                f"duration {duration} > {lim.max_duration}")
        if kind not in _BUFFERS:
            return
        flow = get(msg, "flow", int)
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

    def record(self, msg: Message) -> None:
        """Account for ``msg``, sent or received (a granted open, a close, a run's end)."""
        kind = get(msg, "type", str)
        if kind in _BUFFERS:
            self._memory[(kind, get(msg, "flow", int))] = sum(buffer_sizes(msg))
        elif kind == "close":
            for k in _BUFFERS:
                self._memory.pop((k, get(msg, "flow", int)), None)
        elif kind == "results":
            # A run ends every flow of the session (the server stops their workers).
            self._memory.clear()
