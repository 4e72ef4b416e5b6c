"""The lab against the real kernel: namespaces, veth, addresses, MTU, connectivity, isolation."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pyroute2 import netns as pr_netns

from zcnet.errors import UsageError, ZcnetError
from zcnet.lab import Lab, names, plumbing, topology
from zcnet.lab.rtnl import rtnl
from zcnet.netns import in_netns, netns_exists
from zcnet.uapi.errqueue import IP_MTU
from zcnet.uapi.socket import SO_INCOMING_CPU

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("no_leaks")]

PAYLOAD = os.urandom(256 * 1024)  # several segments even at MTU 9000


def _serve_once(ns: str, family: int, addr: str, ready: threading.Event,
                result: dict[str, object]) -> None:
    """Accept one connection inside NS and keep what arrives, plus the peer address."""
    with in_netns(ns):
        srv = socket.create_server((addr, 0), family=family)
    with srv:
        result["port"] = srv.getsockname()[1]
        ready.set()
        srv.settimeout(10)
        conn, peer = srv.accept()
        with conn:
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        result["data"] = b"".join(chunks)
        result["peer"] = peer[0]


def _transfer(lab: Lab, family: int, src: str, dst: str) -> dict[str, object]:
    """Send PAYLOAD from ns_a to a server in ns_b, each socket opened in its own namespace."""
    result: dict[str, object] = {}
    ready = threading.Event()
    server = threading.Thread(target=_serve_once, args=(lab.ns_b, family, dst, ready, result))
    server.start()
    try:
        assert ready.wait(10)
        with in_netns(lab.ns_a):
            cli = socket.create_connection((dst, result["port"]), timeout=10,
                                           source_address=(src, 0))
        with cli:
            cli.sendall(PAYLOAD)
    finally:
        server.join(15)
    return result


def _link(ns: str, ifname: str) -> dict[str, object]:
    with rtnl(ns) as ipr:
        msg = ipr.link("get", ifname=ifname)[0]
        linkinfo = msg.get("IFLA_LINKINFO")
        return {"mtu": msg.get("IFLA_MTU"), "state": msg.get("IFLA_OPERSTATE"),
                "kind": linkinfo.get("IFLA_INFO_KIND") if linkinfo else None}


def _addrs(ns: str, ifname: str) -> set[str]:
    with rtnl(ns) as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        return {f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(index=idx)
                if a["scope"] == 0}


def test_create_destroy(no_leaks: None) -> None:
    root_links = set(os.listdir("/sys/class/net"))
    with Lab() as lab:
        assert netns_exists(lab.ns_a) and netns_exists(lab.ns_b)
        assert lab.ns_a != lab.ns_b and str(os.getpid()) in lab.name
        assert all(len(n) <= 15 for n in (lab.if_a, lab.if_b))
        for ns, ifname in ((lab.ns_a, lab.if_a), (lab.ns_b, lab.if_b)):
            assert _link(ns, ifname) == {"mtu": 1500, "state": "UP", "kind": "veth"}
            assert _link(ns, "lo")["state"] in ("UNKNOWN", "UP")
        assert f"{lab.addr_a}/30" in _addrs(lab.ns_a, lab.if_a)
        assert f"{lab.addr_b}/30" in _addrs(lab.ns_b, lab.if_b)
        # nothing of the lab ever shows in the root namespace
        assert set(os.listdir("/sys/class/net")) == root_links
        names = (lab.ns_a, lab.ns_b)
    assert not any(netns_exists(n) for n in names)
    assert not lab.is_up and lab.ns_a == ""


def test_exception_in_block_tears_down(no_leaks: None) -> None:
    with pytest.raises(RuntimeError, match="boom"), Lab() as lab:
        names = (lab.ns_a, lab.ns_b)
        raise RuntimeError("boom")
    assert not any(netns_exists(n) for n in names)


def test_down_is_idempotent(no_leaks: None) -> None:
    lab = Lab().up()
    lab.down()
    lab.down()
    assert not lab.is_up


def test_tcp_ipv4(no_leaks: None) -> None:
    with Lab() as lab:
        got = _transfer(lab, socket.AF_INET, lab.addr_a, lab.addr_b)
    assert got["data"] == PAYLOAD
    assert got["peer"] == lab.addr_a


def _ipv6_host() -> bool:
    return Path("/proc/sys/net/ipv6").is_dir()


@pytest.mark.skipif(not _ipv6_host(), reason="kernel without IPv6")
def test_tcp_ipv6(no_leaks: None) -> None:
    with Lab() as lab:
        assert lab.ipv6 and lab.addr6_a and lab.addr6_b
        assert f"{lab.addr6_a}/64" in _addrs(lab.ns_a, lab.if_a)
        got = _transfer(lab, socket.AF_INET6, lab.addr6_a, lab.addr6_b)
        assert got["data"] == PAYLOAD
        assert got["peer"] == lab.addr6_a
        assert lab.env()["ipv6"] is True


def test_no_ipv6_when_not_asked(no_leaks: None) -> None:
    with Lab(ipv6=False) as lab:
        assert lab.addr6_a is None and not lab.ipv6
        assert not any(":" in a for a in _addrs(lab.ns_a, lab.if_a))


def test_mtu_applied_and_changed(no_leaks: None) -> None:
    with Lab(mtu=9000) as lab:
        for ns, ifname in ((lab.ns_a, lab.if_a), (lab.ns_b, lab.if_b)):
            assert _link(ns, ifname)["mtu"] == 9000
        lab.set_mtu(4096)
        for ns, ifname in ((lab.ns_a, lab.if_a), (lab.ns_b, lab.if_b)):
            assert _link(ns, ifname)["mtu"] == 4096
        assert lab.mtu == 4096 and lab.env()["mtu"] == 4096
        # the path MTU a connected socket sees is the veth's
        with in_netns(lab.ns_a), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((lab.addr_b, 9))
            assert s.getsockopt(socket.IPPROTO_IP, IP_MTU) == 4096
        assert _transfer(lab, socket.AF_INET, lab.addr_a, lab.addr_b)["data"] == PAYLOAD


@pytest.mark.skipif(not _ipv6_host(), reason="kernel without IPv6")
def test_ipv6_follows_mtu(no_leaks: None) -> None:
    # below 1280 the kernel strips IPv6 addresses; raising the MTU again must bring them back
    with Lab() as lab:
        lab.set_mtu(1000)
        assert lab.addr6_a is None
        assert not any(":" in a for a in _addrs(lab.ns_a, lab.if_a))
        assert _transfer(lab, socket.AF_INET, lab.addr_a, lab.addr_b)["data"] == PAYLOAD
        lab.set_mtu(1500)
        assert lab.addr6_b is not None
        assert _transfer(lab, socket.AF_INET6, lab.addr6_a, lab.addr6_b)["data"] == PAYLOAD


@pytest.mark.parametrize("mtu", [67, 65536, 0, -1])
def test_bad_mtu_rejected_before_anything_exists(mtu: int, no_leaks: None) -> None:
    with pytest.raises(UsageError, match="out of range") as info:
        Lab(mtu=mtu)
    assert info.value.hint == "choose 68..65535"


def test_bad_set_mtu_keeps_lab(no_leaks: None) -> None:
    with Lab() as lab:
        with pytest.raises(UsageError):
            lab.set_mtu(70000)
        assert _link(lab.ns_a, lab.if_a)["mtu"] == 1500
        lab.set_mtu(65535)  # the top of the range is accepted by veth
        assert _link(lab.ns_b, lab.if_b)["mtu"] == 65535


def test_two_labs_at_once_are_isolated(no_leaks: None) -> None:
    with Lab() as one, Lab(mtu=9000) as two:
        assert {one.ns_a, one.ns_b}.isdisjoint({two.ns_a, two.ns_b})
        assert {one.if_a, one.if_b}.isdisjoint({two.if_a, two.if_b})
        # same addresses in both labs, yet a listener in lab two is unreachable from lab one
        with in_netns(two.ns_b):
            srv = socket.create_server((two.addr_b, 0))
        with srv:
            port = srv.getsockname()[1]
            with in_netns(one.ns_a):
                probe = socket.socket()
            with probe, pytest.raises(ConnectionRefusedError):
                probe.settimeout(5)
                probe.connect((one.addr_b, port))
        for lab in (one, two):
            assert _transfer(lab, socket.AF_INET, lab.addr_a, lab.addr_b)["data"] == PAYLOAD
        assert _link(two.ns_a, two.if_a)["mtu"] == 9000
        assert _link(one.ns_a, one.if_a)["mtu"] == 1500


def test_labs_from_threads_get_distinct_names(no_leaks: None) -> None:
    labs = [Lab() for _ in range(3)]
    threads = [threading.Thread(target=lab.up) for lab in labs]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(lab.is_up for lab in labs)
        assert len({lab.name for lab in labs}) == 3
    finally:
        for lab in labs:
            lab.down()


def test_ns_exec_runs_inside_and_is_stopped_at_down(no_leaks: None) -> None:
    with Lab() as lab:
        out = lab.ns_exec(lab.ns_b, ["cat", f"/sys/class/net/{lab.if_b}/mtu"],
                          stdout=subprocess.PIPE, text=True)
        assert out.communicate(timeout=10)[0].strip() == "1500"
        ns_inode = os.stat(f"/run/netns/{lab.ns_a}").st_ino
        probe = lab.ns_exec(lab.ns_a, ["readlink", "/proc/self/ns/net"],
                            stdout=subprocess.PIPE, text=True)
        assert probe.communicate(timeout=10)[0].strip() == f"net:[{ns_inode}]"
        sleeper = lab.ns_exec(lab.ns_a, ["sleep", "60"])
        with pytest.raises(UsageError):
            lab.ns_exec("not-a-lab-ns", ["true"])
    assert sleeper.returncode is not None  # stopped and reaped by down()


def test_env_metadata(no_leaks: None) -> None:
    with Lab(mtu=4096) as lab:
        env = lab.env()
        assert env == {"lab": True, "mtu": 4096, "veth": [lab.if_a, lab.if_b],
                       "ipv6": lab.ipv6, "rx_steer_cpu": None}


def _received_on(lab: Lab, send_cpu: int) -> int:
    """The CPU that received (SO_INCOMING_CPU) one small segment sent from ``send_cpu``."""
    with in_netns(lab.ns_b):
        srv = socket.create_server((lab.addr_b, 0))
    with in_netns(lab.ns_a):
        cli = socket.socket()
    before = os.sched_getaffinity(0)
    with srv, cli:
        cli.settimeout(10)
        srv.settimeout(10)
        cli.connect((lab.addr_b, srv.getsockname()[1]))
        conn, _ = srv.accept()
        with conn:
            os.sched_setaffinity(0, {send_cpu})  # this thread sends from there
            try:
                cli.sendall(b"x" * 1000)  # one segment, sent at once from this CPU
            finally:
                os.sched_setaffinity(0, before)
            assert conn.recv(2000) == b"x" * 1000
            return conn.getsockopt(socket.SOL_SOCKET, SO_INCOMING_CPU)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_steer_rx_receives_on_the_chosen_cpu(no_leaks: None) -> None:
    """veth receives on the CPU that sent; steered, a segment sent from another CPU is
    received on the chosen one; None undoes it. A CPU this process may not use is refused."""
    c0, c1 = sorted(os.sched_getaffinity(0))[:2]
    with Lab() as lab:
        assert _received_on(lab, c1) == c1
        lab.steer_rx(c0)
        assert lab.env()["rx_steer_cpu"] == c0
        assert _received_on(lab, c1) == c0
        lab.steer_rx(None)
        assert lab.env()["rx_steer_cpu"] is None
        assert _received_on(lab, c1) == c1
        with pytest.raises(UsageError, match="cannot steer"):
            lab.steer_rx(max(os.sched_getaffinity(0)) + 1)
    with pytest.raises(ZcnetError, match="taken down"):
        lab.steer_rx(c0)


def _queue_file(lab: Lab, path: str) -> str:
    return subprocess.run(["ip", "netns", "exec", lab.ns_a, "cat",
                           f"/sys/class/net/{lab.if_a}/queues/{path}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_queue_files_are_written_in_order_and_a_failure_names_the_fix(no_leaks: None) -> None:
    """The per-queue writer netdevsim's XPS and the lab's RPS steering share: writes land in
    the namespace's sysfs in the order given; one that fails is a ZcnetError with the fix."""
    with Lab() as lab:
        plumbing.write_queue_files(lab.ns_a, lab.if_a, [("tx-*", "xps_cpus", "1"),
                                                        ("tx-0", "xps_cpus", "0")], "x", "y")
        assert int(_queue_file(lab, "tx-0/xps_cpus").replace(",", ""), 16) == 0
        plumbing.write_queue_files(lab.ns_a, lab.if_a, [("rx-*", "rps_cpus", "1")], "x", "y")
        assert int(_queue_file(lab, "rx-0/rps_cpus").replace(",", ""), 16) == 1
        with pytest.raises(ZcnetError, match="steering nothing") as e:
            plumbing.write_queue_files(lab.ns_a, lab.if_a, [("rx-*", "no_such_file", "1")],
                                       "steering nothing", "the fix")
        assert e.value.hint == "the fix"


def test_cpu_mask_is_the_kernels_bitmap_text() -> None:
    assert [plumbing.cpu_mask(() if c is None else (c,)) for c in (None, 0, 5, 31, 32, 64)] == [
        "0", "1", "20", "80000000", "1,00000000", "1,00000000,00000000"]
    assert plumbing.cpu_mask(range(36)) == "f,ffffffff"  # XPS on every CPU of a big machine


@pytest.mark.parametrize("taken", [("a",), ("b",), ("a", "b")], ids=["a", "b", "both"])
def test_name_collision_moves_to_next_name(taken: tuple[str, ...], no_leaks: None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # e.g. litter of a dead process whose pid we now have: never reuse or remove it
    n = 10_000 + os.getpid() % 1000
    monkeypatch.setattr(topology, "_counter", itertools.count(n))
    squatter = names.owned(os.getpid(), n)
    for side in taken:
        pr_netns.create(squatter.name + side)
    try:
        with Lab() as lab:
            assert lab.name == f"zc{os.getpid()}x{n + 1}"  # the next number, same owner
            assert all(netns_exists(squatter.name + side) for side in taken)
            assert _transfer(lab, socket.AF_INET, lab.addr_a, lab.addr_b)["data"] == PAYLOAD
    finally:
        for side in taken:
            pr_netns.remove(squatter.name + side)


def test_parallel_processes_never_collide(no_leaks: None) -> None:
    code = ("from zcnet.lab import Lab\n"
            "with Lab() as one, Lab() as two:\n"
            "    print(one.name, two.name, flush=True)\n"
            "    input()\n")  # hold both labs until the parent has seen every name
    env = {**os.environ, "PYTHONPATH": str(Path(topology.__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    try:
        seen = [p.stdout.readline().split() for p in procs if p.stdout]
        flat = [n for pair in seen for n in pair]
        assert len(flat) == 6 and len(set(flat)) == 6
        assert all(netns_exists(n + "a") for n in flat)
    finally:
        for p in procs:
            p.communicate("\n", timeout=20)
    assert all(p.returncode == 0 for p in procs)
    assert not any(netns_exists(n + "a") for n in flat)


@pytest.mark.skipif(not _ipv6_host(), reason="kernel without IPv6")
def test_ipv6_refused_by_kernel_leaves_ipv4_lab(no_leaks: None) -> None:
    with Lab() as lab:
        for ns, ifname in ((lab.ns_a, lab.if_a), (lab.ns_b, lab.if_b)):
            with in_netns(ns):
                Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1\n")
        lab.set_mtu(1500)  # re-adding the addresses now gets EACCES from the kernel
        assert not lab.ipv6 and lab.addr6_a is None and lab.env()["ipv6"] is False
        assert _transfer(lab, socket.AF_INET, lab.addr_a, lab.addr_b)["data"] == PAYLOAD


def test_failed_setup_removes_what_was_made(no_leaks: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def fail_on_b(self: Lab, ns: str, ifname: str, addr: str) -> None:
        made.extend((self.ns_a, self.ns_b))
        if ns == self.ns_b:
            raise ZcnetError("injected failure")
        real_configure(self, ns, ifname, addr)

    real_configure = Lab._configure_side
    monkeypatch.setattr(Lab, "_configure_side", fail_on_b)
    lab = Lab()
    with pytest.raises(ZcnetError, match="injected"):
        lab.up()
    assert made and not any(netns_exists(ns) for ns in made)
    assert not lab.is_up
