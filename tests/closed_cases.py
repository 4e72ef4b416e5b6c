"""Objects with a close(), and how to call each of their public methods: the table behind
tests/project/test_use_after_close.py. ``python closed_cases.py NAME`` builds case NAME, closes it
twice, calls every public method (found by introspection, so new methods are covered without an
edit here) and prints one JSON object: method -> "ok", "closed" (ClosedError) or the other error.
It runs in a child process, so a crash (SIGSEGV) fails the test instead of ending the run.

Where a kernel step cannot happen on this machine (zcrx registration, devmem's dma-buf binding:
no NIC here supports them) the factory replaces only that one step; the provider's own memory,
ring and sockets are real, and those are what use after close would touch.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zcnet.errors import ClosedError

KEEP: list[Any] = []  # sockets and peers the objects use, alive until the process ends
CTX: dict[str, Any] = {}


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    ls = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(ls.getsockname())
    server, _ = ls.accept()
    KEEP.extend((ls, client, server))
    return client, server


def udp_connected() -> socket.socket:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect(sink.getsockname())
    sock.setblocking(False)
    KEEP.extend((sink, sock))
    return sock


def memfd(size: int) -> int:
    fd = os.memfd_create("zcnet-closed-test")
    os.ftruncate(fd, size)
    return fd


# --- factories ---------------------------------------------------------------------------------

def sender(kind: str) -> Callable[[], Any]:
    def make() -> Any:
        from zcnet.tx.senders import make_sender

        return make_sender(kind, tcp_pair()[0], bytearray(1 << 16), slots=4)
    return make


def burst(mode: str) -> Callable[[], Any]:
    def make() -> Any:
        from zcnet.tx.udp_modes import MODES
        from zcnet.tx.uring_send import UringSender

        factory = UringSender if mode == "uring" else MODES[mode]
        return factory(udp_connected(), [100] * 4)
    return make


def hwcounters() -> Any:
    from zcnet.tx.hwcount import HwCounters
    from zcnet.uapi import perf_event as pe

    hw = HwCounters.open({"task-clock": (pe.PERF_TYPE_SOFTWARE, pe.PERF_COUNT_SW_TASK_CLOCK)})
    assert hw is not None, "software perf events must open"
    return hw


def sink() -> Any:
    from zcnet.tx.sink import Sink

    return Sink("127.0.0.1", (100,))


def receiver(**kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        from zcnet.rx.zc.api import open_receiver

        client, server = tcp_pair()
        rx = open_receiver(server, "soft", area_size=1 << 20, buf_size=64 << 10, **kw)
        client.sendall(b"x" * 100)
        got: list[Any] = []
        while not got:
            got = rx.recv(timeout=5)
        CTX["chunk"] = got[0]  # held across close: releasing it afterwards is allowed
        rx.release_many(got[1:])
        return rx
    return make


def soft_provider(incremental: bool) -> Callable[[], Any]:
    def make() -> Any:
        from zcnet.rx.zc.soft import open_soft

        prov = open_soft(tcp_pair()[1].fileno(), 1 << 20, 64 << 10, incremental=incremental)
        assert type(prov).__name__ == ("IncrementalSoftProvider" if incremental
                                       else "SoftProvider")
        prov.arm()
        return prov
    return make


def zcrx_provider() -> Any:
    from zcnet.rx.zc import zcrx, zcrx_queue
    from zcnet.rx.zc.area import Area

    # The kernel refuses zcrx on lo (EOPNOTSUPP); everything else (ring, refill ring in user
    # memory, area) is built for real.
    zcrx_queue.register_ifq = lambda ring, reg, ifname="?": None
    return zcrx.ZcrxProvider(tcp_pair()[1].fileno(), Area(1 << 20), "lo", 0, rq_entries=64)


def devmem_provider() -> Any:
    from zcnet.nic.genl import GenlSocket
    from zcnet.nic.netdev import DmabufBinding
    from zcnet.rx.zc import devmem, devmem_binding

    # bind-rx needs a NIC with the queue API; the binding object around a real netlink socket
    # stands in for it. The socket duplicate and the area (a memfd as dma-buf) are real.
    devmem_binding.bind_rx = lambda ifname, fd, queues: DmabufBinding(GenlSocket(), 1, 1, queues)
    return devmem.DevmemProvider(
        tcp_pair()[1].fileno(), devmem_binding.acquire("lo", [0], 1 << 20, memfd(1 << 20)))


def area(dmabuf: bool) -> Callable[[], Any]:
    def make() -> Any:
        from zcnet.rx.zc.area import Area

        return Area(1 << 20, dmabuf_fd=memfd(1 << 20) if dmabuf else None)
    return make


def nic_engine(name: str) -> Callable[[], Any]:
    def make() -> Any:
        from zcnet.rx.engine import EngineOptions
        from zcnet.rx.registry import make_engine

        return make_engine(name, EngineOptions(ifname="lo", queue=0))
    return make


def genl() -> Any:
    from zcnet.nic.genl import GenlSocket

    return GenlSocket()


def device() -> Any:
    from zcnet.nic.device import Device

    return Device("lo")


def binding() -> Any:
    from zcnet.nic.genl import GenlSocket
    from zcnet.nic.netdev import DmabufBinding

    return DmabufBinding(GenlSocket(), 1, 1, [0])


def lab() -> Any:
    from zcnet.lab import Lab

    return Lab(ipv6=False).up()


# --- arguments ---------------------------------------------------------------------------------

def _family_request() -> tuple[Any, ...]:
    from zcnet.nic.genl import CTRL
    from zcnet.uapi import genetlink as g

    return ("nlctrl", g.CTRL_CMD_GETFAMILY, CTRL, {"family-name": "nlctrl"})


def _drvinfo() -> tuple[Any, ...]:
    from zcnet.uapi import ethtool as e

    return (e.SIOCETHTOOL, e.ethtool_drvinfo(cmd=e.ETHTOOL_GDRVINFO))


ANY_SOCKET = ("attach", lambda: (tcp_pair()[1].fileno(),))


@dataclass
class Case:
    factory: Callable[[], Any]
    #: method -> its arguments, or a function returning them (called after close)
    args: dict[str, Any] = field(default_factory=dict)
    #: methods documented as valid after close: they must return normally
    allowed: frozenset[str] = frozenset()
    #: methods not called, with the reason
    skip: dict[str, str] = field(default_factory=dict)
    #: further uses that are not methods (iteration): name -> use
    extra: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    close: str = "close"
    root: bool = False


SENDER = {"args": {"send": (100,), "in_flight": (0,)}, "allowed": frozenset({"stats"})}
BURST = {"args": {}}
# quiesce and recycle_closed are steps of the receiver's close and of releases after it: they
# touch no provider memory and answer after close too.
def _spare_area() -> object:
    """An area of its own for area_done (which unmaps or hands on what it is given)."""
    from zcnet.rx.zc.area import Area

    return Area(1 << 16)


# area_done is the receiver's last step, when it holds nothing of the area (after close).
PROVIDER = {"args": {"reap": (0,), "recycle": ([0], [100]), "attach": ANY_SOCKET[1],
                     "quiesce": (False,), "recycle_closed": ([],),
                     "area_done": lambda: (_spare_area(),), "watch_releases": ((),)},
            "allowed": frozenset({"held_back", "extra_stats", "kernel_copy", "quiesce",
                                  "recycle_closed", "area_done", "watch_releases"})}
RECEIVER = {"args": {"recv": (0,), "recv_batch": (0,), "on_release": (None,),
                     "release": lambda: (CTX["chunk"],), "release_many": ([],)},
            "allowed": frozenset({"stats_dict", "release", "release_many"}),
            "extra": {"iterate": lambda rx: next(iter(rx))}}

CASES: dict[str, Case] = {
    **{f"sender-{k}": Case(sender(k), **SENDER)  # type: ignore[arg-type]
       for k in ("copy", "msgzc", "sendzc", "sendzc-plain")},
    **{f"burst-{m}": Case(burst(m), **BURST) for m in ("single", "mmsg", "gso", "uring")},
    "hwcounters": Case(hwcounters),
    "sink": Case(sink, args={"snapshot": (10,)}),
    "receiver-soft": Case(receiver(), **RECEIVER),  # type: ignore[arg-type]
    "receiver-soft-incremental": Case(receiver(incremental=True), **RECEIVER),  # type: ignore[arg-type]
    "provider-soft": Case(soft_provider(False), **PROVIDER),  # type: ignore[arg-type]
    "provider-soft-incremental": Case(soft_provider(True), **PROVIDER),  # type: ignore[arg-type]
    "provider-zcrx": Case(zcrx_provider, **PROVIDER),  # type: ignore[arg-type]
    "provider-devmem": Case(devmem_provider, **PROVIDER),  # type: ignore[arg-type]
    "area": Case(area(False), args={"sync": (True,), "grow": (4096,), "ungrow": (0,)}),
    "area-dmabuf": Case(area(True), args={"sync": (True,), "grow": (4096,), "ungrow": (0,)}),
    "engine-zcrx": Case(nic_engine("zcrx"),
                        args={"run": lambda: (tcp_pair()[1], None)}),
    "engine-devmem": Case(nic_engine("devmem"),
                          args={"run": lambda: (tcp_pair()[1], None)}),
    "genl-socket": Case(genl, args={"family": ("nlctrl",), "do": _family_request,
                                    "dump": _family_request}),
    "device": Case(device, args={"ifreq_ioctl": _drvinfo,
                                 "genl_do": lambda: _family_request(),
                                 "genl_dump": lambda: _family_request(),
                                 "raise_unsupported": ("a setting", "doing it")},
                   skip={"translate": "builds an error from its arguments alone"}),
    "dmabuf-binding": Case(binding),
    "lab": Case(lab, close="down", root=True,
                args={"ns_exec": lambda: ("zcnonexistenta", ["true"]), "set_mtu": (1500,),
                      "steer_rx": (None,)},
                allowed=frozenset({"env"}),
                skip={"up": "brings a new lab up (new names): a Lab may be used again"}),
}


def public_methods(obj: Any) -> list[str]:
    """Public instance methods of ``obj``'s class (classmethods and staticmethods are
    constructors or helpers, properties are read-outs)."""
    out = []
    for name, _ in inspect.getmembers(type(obj)):
        if name.startswith("_"):
            continue
        raw = inspect.getattr_static(type(obj), name)
        if isinstance(raw, (classmethod, staticmethod, property)) or not callable(raw):
            continue
        out.append(name)
    return out


def _required_args(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return any(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in sig.parameters.values())


def _outcome(call: Callable[[], Any]) -> str:
    try:
        call()
    except ClosedError:
        return "closed"
    except Exception as exc:  # any other outcome is reported; the parent fails the test
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def run(name: str) -> dict[str, str]:
    case = CASES[name]
    obj = case.factory()
    methods = public_methods(obj)
    getattr(obj, case.close)()
    second = _outcome(getattr(obj, case.close))
    out: dict[str, str] = {f"{case.close} (again)": second}
    for m in methods:
        if m == case.close or m in case.skip:
            continue
        fn = getattr(obj, m)
        args = case.args.get(m, ())
        if callable(args):
            args = args()
        if not args and _required_args(fn):
            out[m] = "needs arguments: add them to closed_cases.CASES"
            continue
        out[m] = _outcome(lambda fn=fn, args=args: fn(*args))
    for label, use in case.extra.items():
        out[label] = _outcome(lambda use=use: use(obj))
    return out


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1])), flush=True)
