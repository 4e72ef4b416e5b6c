"""Two network namespaces joined by a veth pair: the lab every benchmark can run in.

Some facts about veth pairs in namespaces:

- The veth is created inside namespace a with its peer placed straight into namespace b, so no
  interface ever appears in the root namespace, not even for an instant.
- Deleting either end deletes both, and a namespace going away deletes the interfaces in it. The
  teardown still deletes the veth explicitly: a namespace outlives its /run/netns mount while any
  process or socket holds it, and its veth would linger unseen.
- The kernel strips every IPv6 address from a device whose MTU drops below 1280, and does not put
  them back when it rises again; ``set_mtu`` re-adds them.
- A new veth's transmit queue is only attached once the link-watch work has seen carrier; traffic
  sent before that is dropped. ``up`` waits for operstate UP on both ends so the first SYN lands.
- veth hands each packet to its peer on the CPU that sent it. One flow's data leaves from the
  sender's CPU and also from the CPU that processes its ACKs (ACK-clocked transmits), so its
  segments are received on two CPUs at once and arrive out of order: measured at MTU 4096,
  iperf3 with the sender and receiver on two CPUs retransmitted 3,000-44,000 segments in 3 s
  (TcpExtTCPOFOQueue climbing, no drop anywhere) and ran at 25-35 Gbit/s from run to run.
  ``steer_rx`` makes b's side receive everything on one CPU (RPS), as a NIC queue whose
  interrupt sits on that CPU does: no retransmits in the runs measured, and the spread between
  runs is no longer loss recovery's (iperf3 at MTU 4096 over five runs: 14.7-17.2 Gbit/s
  steered, 18.2-45.3 unsteered).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Literal, overload

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD

from zcnet.errors import ClosedError, UsageError, ZcnetError
from zcnet.jsonvalue import JSONObject
from zcnet.lab import names, netdevsim, registry
from zcnet.lab.plumbing import (
    cpu_mask,
    create_netns,
    delete_veth,
    disable_dad,
    is_up,
    remove_netns,
    write_queue_files,
)
from zcnet.lab.rtnl import ifindex, rtnl, translate
from zcnet.netns import NeedRoot, Stream, can_create_netns, netns_popen

log = logging.getLogger(__name__)

ADDR_A, ADDR_B, PREFIX4 = "198.18.0.1", "198.18.0.2", 30
ADDR6_A, ADDR6_B, PREFIX6 = "2001:db8::1", "2001:db8::2", 64
MTU_MIN, MTU_MAX = 68, 65535  # veth's min_mtu and max_mtu
IPV6_MIN_MTU = 1280
UP_TIMEOUT = 5.0
DEVICES = ("veth", "netdevsim")

_counter = itertools.count(1)
_counter_lock = threading.Lock()


def check_mtu(mtu: int) -> int:
    if not isinstance(mtu, int) or not MTU_MIN <= mtu <= MTU_MAX:
        raise UsageError(f"MTU {mtu!r} is out of range for veth",
                         f"choose {MTU_MIN}..{MTU_MAX}")
    return mtu


class Lab:
    """Namespaces ``ns_a``/``ns_b`` with veth ``if_a``/``if_b``, addressed and up.

    ``device="netdevsim"`` joins them with two linked netdevsim ports of ``queues`` queues each
    instead (see ``zcnet.lab.netdevsim``; needs a kernel with netdevsim).

    Use as a context manager, entered once (a nested ``with`` on the same lab is refused); the
    lab is gone after the block however it ends, and ``ns_exec``/``set_mtu`` then raise
    ClosedError (``up()`` makes a new lab with new names). Labs still up at
    interpreter exit or on SIGTERM/SIGHUP are removed too, and a signal arriving while the lab is
being changed waits until the change is complete (see ``zcnet.lab.registry``).
    ``persistent=True`` (for ``zcnet lab up``) makes a lab that outlives this process.
    """

    def __init__(self, mtu: int = 1500, *, ipv6: bool = True, persistent: bool = False,
                 device: str = "veth", queues: int = netdevsim.DEFAULT_QUEUES) -> None:
        self.mtu = check_mtu(mtu)
        if device not in DEVICES:
            raise UsageError(f"unknown lab device {device!r}", f"one of {', '.join(DEVICES)}")
        if not isinstance(queues, int) or not 1 <= queues <= 64:
            raise UsageError(f"queue count {queues!r} out of range", "choose 1..64")
        self.device, self.queues = device, queues
        self.persistent = persistent
        self.owner_pid = os.getpid()
        self.name = ""
        self.ns_a = self.ns_b = ""
        self.if_a = self.if_b = ""
        self.addr_a, self.addr_b, self.prefixlen = ADDR_A, ADDR_B, PREFIX4
        self.prefixlen6 = PREFIX6
        self._want_ipv6 = ipv6
        self._ipv6 = False
        self._procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
        self._lock = threading.RLock()
        self._entered = False  # a `with` block owns the lab
        self._was_up = False
        self._steer_cpu: int | None = None

    # -- public view ---------------------------------------------------------------------------

    @property
    def ipv6(self) -> bool:
        return self._ipv6

    @property
    def addr6_a(self) -> str | None:
        return ADDR6_A if self._ipv6 else None

    @property
    def addr6_b(self) -> str | None:
        return ADDR6_B if self._ipv6 else None

    @property
    def is_up(self) -> bool:
        return bool(self.name)

    def env(self) -> JSONObject:
        """Metadata for the JSON envelope."""
        return {"lab": True, "mtu": self.mtu, self.device: [self.if_a, self.if_b],
                "ipv6": self._ipv6, "rx_steer_cpu": self._steer_cpu}

    def __repr__(self) -> str:
        return f"Lab({self.name or 'down'}, mtu={self.mtu}, ipv6={self._ipv6})"

    # -- lifetime ------------------------------------------------------------------------------

    def __enter__(self) -> Lab:
        # One `with` block owns the lab: a nested one would take it down when the inner block
        # ends, under the outer block still using it.
        if self._entered:
            raise UsageError(f"lab {self.name or '(coming up)'} is already in a `with` block",
                             "use the lab inside the outer `with` block; do not enter it again")
        self._entered = True
        with ExitStack() as undo:
            # A signal held during setup is delivered as up() returns, before the `with` body
            # (and so __exit__) is entered: the lab must not outlive that.
            undo.callback(self.down)
            undo.callback(setattr, self, "_entered", False)
            self.up()
            undo.pop_all()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._entered = False
        self.down()

    def up(self) -> Lab:
        with self._lock, registry.deferred():
            if self.name:
                return self
            if not can_create_netns():
                raise NeedRoot
            if self.device == "netdevsim":
                netdevsim.require()
            self.owner_pid = os.getpid()  # whoever brings it up owns it, even a forked child
            if not self.persistent:
                registry.register(self)
            with ExitStack() as undo:
                undo.callback(self.down)  # also on Ctrl-C mid-setup: whatever was made goes
                self._create_namespaces()
                self._wire()
                undo.pop_all()
            log.info("lab %s up: %s/%s mtu %d ipv6 %s", self.name, self.ns_a, self.ns_b,
                     self.mtu, self._ipv6)
            return self

    def down(self) -> None:
        """Remove everything the lab made. Idempotent, and safe on a half-built lab."""
        with self._lock, registry.deferred():
            if os.getpid() != self.owner_pid:
                return  # a forked child never tears down its parent's lab
            self._stop_procs()
            failed: OSError | None = None
            if self.name and self.device == "netdevsim":
                try:
                    netdevsim.delete_lab_devices(self._lab_name())
                except ZcnetError as exc:
                    # Left for `zcnet lab down` (its ID names this lab) if it cannot go now.
                    log.warning("deleting the netdevsim devices of %s: %s", self.name, exc)
            if self.name:
                try:
                    delete_veth(self.ns_a, self.if_a)
                except (OSError, NetlinkError, ZcnetError) as exc:
                    # Removing the namespaces below still deletes the veth once unreferenced.
                    log.warning("deleting veth %s: %s", self.if_a, exc)
                for ns in (self.ns_a, self.ns_b):
                    try:
                        if ns:  # empty when setup stopped between the two namespaces
                            remove_netns(ns)
                    except OSError as exc:
                        failed = failed or exc
                log.info("lab %s down", self.name)
            name = self.name
            self._steer_cpu = None
            self.name = self.ns_a = self.ns_b = self.if_a = self.if_b = ""
            self._ipv6 = False
            self._was_up = self._was_up or bool(name)
            registry.unregister(self)
            if failed is not None:
                # Left for `zcnet lab down` (the sweeper) once this process is gone.
                raise translate(failed, f"removing lab {name}") from failed

    def _next_name(self, attempt: int) -> names.LabName:
        if self.persistent:
            return names.persistent(attempt)
        with _counter_lock:
            return names.owned(self.owner_pid, next(_counter))

    def _create_namespaces(self) -> None:
        # Names may collide with a stale lab of a dead process whose pid we reuse, or with a
        # concurrent `lab up`: O_EXCL on the mount point tells, and we move on to the next name.
        for attempt in range(1000):
            lab = self._next_name(attempt)
            if not names.fits(lab):
                raise ZcnetError(f"lab name {lab.name} is too long for an interface name")
            if not create_netns(lab.ns_a):
                continue
            self.name, self.ns_a, self.if_a = lab.name, lab.ns_a, lab.ns_a
            if not create_netns(lab.ns_b):
                remove_netns(lab.ns_a)
                self.name = self.ns_a = self.if_a = ""
                continue
            self.ns_b = self.if_b = lab.ns_b
            return
        raise ZcnetError("no free lab name", "`zcnet lab down` sweeps stale labs")

    def _lab_name(self) -> names.LabName:
        return names.LabName(self.name, None if self.persistent else self.owner_pid)

    def _wire(self) -> None:
        if self.device == "netdevsim":
            self._wire_netdevsim()
        else:
            self._wire_veth()
        for ns, ifname, addr in ((self.ns_a, self.if_a, ADDR_A), (self.ns_b, self.if_b, ADDR_B)):
            self._configure_side(ns, ifname, addr)
        self._ipv6 = self._want_ipv6 and self.mtu >= IPV6_MIN_MTU and self._add_ipv6()
        self._wait_up()

    def _wire_netdevsim(self) -> None:
        """One netdevsim device per namespace, its port renamed like the namespace, linked."""
        lab = self._lab_name()
        index = {}
        for side, ns, ifname in (("a", self.ns_a, self.if_a), ("b", self.ns_b, self.if_b)):
            dev_id = netdevsim.device_id(lab, side)
            netdevsim.create(ns, dev_id, self.queues)
            try:
                with rtnl(ns) as ipr:
                    port = [m for m in ipr.get_links()
                            if m.get("IFLA_PARENT_DEV_NAME") == f"netdevsim{dev_id}"]
                    if len(port) != 1:
                        raise ZcnetError(f"expected one port of netdevsim{dev_id} in {ns}, "
                                         f"found {len(port)}")
                    ipr.link("set", index=port[0]["index"], ifname=ifname)
                    index[ns] = port[0]["index"]
            except NetlinkError as exc:
                raise translate(exc, f"naming the netdevsim port in {ns}") from exc
        netdevsim.link(self.ns_a, index[self.ns_a], self.ns_b, index[self.ns_b])

    def _wire_veth(self) -> None:
        try:
            with rtnl(self.ns_a) as ipr:
                ipr.link("add", ifname=self.if_a, kind="veth",
                         peer={"ifname": self.if_b, "net_ns_fd": self.ns_b})
        except NetlinkError as exc:
            raise translate(exc, "creating veth pair") from exc

    def _configure_side(self, ns: str, ifname: str, addr: str) -> None:
        disable_dad(ns, ifname)
        try:
            with rtnl(ns) as ipr:
                ipr.link("set", index=ifindex(ipr, "lo"), state="up")
                idx = ifindex(ipr, ifname)
                ipr.link("set", index=idx, mtu=self.mtu)
                ipr.addr("add", index=idx, address=addr, prefixlen=PREFIX4)
                ipr.link("set", index=idx, state="up")
        except NetlinkError as exc:
            raise translate(exc, f"configuring {ifname} in {ns}") from exc

    def _add_ipv6(self) -> bool:
        """Add the IPv6 addresses, usable at once (no DAD); False where IPv6 is off."""
        pairs = ((self.ns_a, self.if_a, ADDR6_A), (self.ns_b, self.if_b, ADDR6_B))
        for ns, ifname, addr in pairs:
            try:
                with rtnl(ns) as ipr:
                    ipr.addr("add", index=ifindex(ipr, ifname), address=addr,
                             prefixlen=PREFIX6, flags=IFA_F_NODAD)
            except NetlinkError as exc:
                if exc.code == errno.EEXIST:
                    continue  # kept across an MTU change that stayed >= 1280
                # EACCES: disable_ipv6 set; EAFNOSUPPORT: ipv6.disable=1. IPv4 only, then.
                log.info("lab without IPv6: %s", os.strerror(exc.code))
                return False
        return True

    def _wait_up(self) -> None:
        deadline = time.monotonic() + UP_TIMEOUT
        for ns, ifname in ((self.ns_a, self.if_a), (self.ns_b, self.if_b)):
            with rtnl(ns) as ipr:
                idx = ifindex(ipr, ifname)
                while not is_up(ipr.link("get", index=idx)[0]):
                    if time.monotonic() > deadline:
                        raise ZcnetError(f"{self.device} {ifname} did not come up within "
                                         f"{UP_TIMEOUT} s")
                    time.sleep(0.005)

    # -- changes while up ----------------------------------------------------------------------

    def set_mtu(self, mtu: int) -> None:
        """Set the MTU on both veth ends (IPv6 addresses follow: dropped below 1280, re-added)."""
        check_mtu(mtu)
        with self._lock, registry.deferred():
            self._require_up("set_mtu")
            for ns, ifname in ((self.ns_a, self.if_a), (self.ns_b, self.if_b)):
                try:
                    with rtnl(ns) as ipr:
                        ipr.link("set", index=ifindex(ipr, ifname), mtu=mtu)
                except NetlinkError as exc:
                    raise translate(exc, f"setting MTU {mtu} on {ifname}") from exc
            self.mtu = mtu
            self._ipv6 = self._want_ipv6 and mtu >= IPV6_MIN_MTU and self._add_ipv6()

    def steer_rx(self, cpu: int | None) -> None:
        """Process every packet that arrives at b's device (the a -> b direction every lab flow
        sends its data in) on CPU ``cpu``, by RPS on each of its receive queues; None undoes
        it. See the module docstring for why a veth lab wants it."""
        if cpu is not None and (not isinstance(cpu, int) or cpu < 0
                                or cpu not in os.sched_getaffinity(0)):
            raise UsageError(f"cannot steer the lab's receive to CPU {cpu!r}",
                             f"use one of the CPUs this process may run on: "
                             f"{sorted(os.sched_getaffinity(0))}")
        with self._lock, registry.deferred():
            self._require_up("steer_rx")
            write_queue_files(self.ns_b, self.if_b,
                              [("rx-*", "rps_cpus", cpu_mask(() if cpu is None else (cpu,)))],
                              f"could not steer {self.if_b}'s receive to CPU {cpu}",
                              "a kernel built without CONFIG_RPS cannot; run unsteered")
            self._steer_cpu = cpu

    @overload
    def ns_exec(self, ns: str, argv: Sequence[str], *, text: Literal[True], stdin: Stream = None,
                stdout: Stream = None, stderr: Stream = None, bufsize: int = -1,
                env: Mapping[str, str] | None = None) -> subprocess.Popen[str]: ...

    @overload
    def ns_exec(self, ns: str, argv: Sequence[str], *, text: Literal[False] = False,
                stdin: Stream = None, stdout: Stream = None, stderr: Stream = None,
                bufsize: int = -1,
                env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]: ...

    def ns_exec(self, ns: str, argv: Sequence[str], *, text: bool = False, stdin: Stream = None,
                stdout: Stream = None, stderr: Stream = None, bufsize: int = -1,
                env: Mapping[str, str] | None = None
                ) -> subprocess.Popen[str] | subprocess.Popen[bytes]:
        """Start ARGV inside NS (``lab.ns_a`` or ``lab.ns_b``), the streams and the rest as
        ``netns_popen`` takes them. Still running at ``down()``, it gets SIGTERM, then SIGKILL
        after 2 s, and is reaped."""
        with self._lock, registry.deferred():
            self._require_up("ns_exec")
            if ns not in (self.ns_a, self.ns_b):
                raise UsageError(f"{ns!r} is not a namespace of lab {self.name}",
                                 f"use {self.ns_a} or {self.ns_b}")
            proc: subprocess.Popen[str] | subprocess.Popen[bytes]
            if text:
                proc = netns_popen(ns, argv, text=True, stdin=stdin, stdout=stdout,
                                   stderr=stderr, bufsize=bufsize, env=env)
            else:
                proc = netns_popen(ns, argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                   bufsize=bufsize, env=env)
            self._procs.append(proc)
            return proc

    def _require_up(self, method: str) -> None:
        if self.name:
            return
        if self._was_up:
            raise ClosedError(f"{method}() on a lab that was taken down",
                              "use it inside its `with Lab() as lab:` block, or up() it again")
        raise UsageError("the lab is not up", "use it inside `with Lab() as lab:`")

    def _stop_procs(self) -> None:
        procs, self._procs = self._procs, []
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
