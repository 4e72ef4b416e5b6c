"""For real on netdevsim: labs, NIC setup and steering, zcrx and devmem on an RX queue (devmem
TX: tests/tx/test_tx_devmem_vm.py). These run inside a VM booted with zcnet's netdevsim test kernel
(``zcnet vm build-kernel``); on the host they report the inner outcome. That netdevsim is a
header-split NIC whose DMA is simulated: it writes the payload into the queue's provider memory
through the DMA address, a CPU copy standing in for the DMA engine. So the kernel's zero-copy
paths run for real (its own copy counters say 0); a NIC's DMA and its speed are not shown."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from zc_helpers import MIB, PAT, Sender, ZcrxServer, check, check_to_eof, send_from_child
from zcnet.bench.remote import NetnsServer
from zcnet.errors import ZcnetError
from zcnet.lab import Lab, netdevsim
from zcnet.netns import in_netns, netns_popen
from zcnet.nic import ethtool, info, netdev, ntuple, setup
from zcnet.nic.arrival import WrongQueue, arrived_on
from zcnet.nic.device import Device
from zcnet.rx.zc import open_receiver
from zcnet.rx.zc.area import HUGE_2MB, udmabuf_create
from zcnet.rx.zc.devnote import NETDEVSIM_DMA_NOTE
from zcnet.rx.zc.zcrx import open_zcrx_queue

pytestmark = [pytest.mark.vm(kernel="nsim"), pytest.mark.root]

QUEUES = 4
QUEUE = 2
PORT = 9999          # the port nic setup steers to QUEUE (the lab's namespaces are private)
OTHER_PORTS = (5001, 5002, 5003, 5004)
SET = (2, 3)         # the queues of the several-queue setups
SET_PORTS = tuple(range(9000, 9008))
BACKGROUND = 4096    # bytes a queue may see besides a test's flows (neighbour discovery, ...)


def _ours() -> list[int]:
    return [i for i in netdevsim.device_ids() if netdevsim.owner_of(i) is not None]


@pytest.fixture
def lab(no_leaks) -> Iterator[Lab]:
    with Lab(device="netdevsim", queues=QUEUES) as lab:
        yield lab
    assert _ours() == []


def _zcnet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zcnet", *args], capture_output=True,
                          text=True, timeout=timeout)


def _state(dev: Device) -> dict[str, object]:
    """What setup may change: rings (HDS), channels, active features, rules and RSS."""
    rings = ethtool.rings_get(dev)
    feats = ethtool.features_get(dev)
    return {"tcp-data-split": rings.get("tcp-data-split"), "hds-thresh": rings.get("hds-thresh"),
            "channels": ethtool.channels_get(dev).get("combined-count"),
            "features": sorted(feats["active"].value), "rules": ntuple.rule_count(dev),
            "rss": ethtool.rss_get(dev).get("indir"), "contexts": ethtool.rss_contexts(dev)}


def _pair(lab: Lab, port: int = 0, v6: bool = False) -> tuple[socket.socket, socket.socket]:
    """(client in side a, server in side b), connected to ``port`` of side b."""
    addr = lab.addr6_b if v6 else lab.addr_b
    assert addr, "the lab has no IPv6"
    family = socket.AF_INET6 if v6 else socket.AF_INET
    with in_netns(lab.ns_b):
        listener = socket.create_server((addr, port), family=family)
    with listener:
        with in_netns(lab.ns_a):
            client = socket.create_connection((addr, listener.getsockname()[1]), timeout=120)
        server, _ = listener.accept()
    return client, server


@contextmanager
def _received(lab: Lab, total: int, port: int = 0, v6: bool = False) -> Iterator[socket.socket]:
    """A plain receiver on side b that got ``total`` pattern bytes (checked) from side a, then
    EOF; closed when the block ends."""
    client, server = _pair(lab, port, v6)
    sender = Sender(client, total)
    sender.start()
    got = bytearray()
    with server:
        while chunk := server.recv(1 << 16):
            got += chunk
        sender.join(120)
        assert sender.error is None and PAT.matches(0, got) and len(got) == total
        yield server


def _stream(lab: Lab, total: int, port: int = 0, v6: bool = False) -> None:
    with _received(lab, total, port, v6):
        pass


def _rx_bytes(dev: Device) -> dict[int, int]:
    """Bytes each RX queue delivered (netdev qstats, counted per queue by the patched driver)."""
    return {r["queue-id"]: r.get("rx-bytes", 0) for r in netdev.qstats(dev)
            if r.get("queue-type") == "rx"}


def _delta(dev: Device, before: dict[int, int]) -> dict[int, int]:
    return {q: n - before.get(q, 0) for q, n in _rx_bytes(dev).items()}


# --- the lab ---------------------------------------------------------------------------------

def test_netdevsim_lab_carries_tcp_on_its_queues(lab):
    assert lab.env()["netdevsim"] == [lab.if_a, lab.if_b]
    with Device.open(lab.if_b, lab.ns_b) as dev:
        assert dev.driver == "netdevsim"
        assert ethtool.channels_get(dev)["combined-count"] == QUEUES
        before = _rx_bytes(dev)
        _stream(lab, 1 << 20)
        assert sum(_delta(dev, before).values()) >= 1 << 20  # counted on the queues
    assert len(_ours()) == 2


def test_lab_up_json_then_down_removes_the_devices(no_leaks):
    up = _zcnet("lab", "up", "--device", "netdevsim", "--queues", "3", "--json")
    assert up.returncode == 0, up.stderr
    doc = json.loads(up.stdout)
    try:
        assert doc["device"] == "netdevsim" and doc["queues"] == 3
        assert [s["ipv4"] for s in doc["sides"]] == ["198.18.0.1/30", "198.18.0.2/30"]
        assert [s["ipv6"] for s in doc["sides"]] == ["2001:db8::1/64", "2001:db8::2/64"]
        assert [s["namespace"] for s in doc["sides"]] == doc["namespaces"]
        assert len(_ours()) == 2
    finally:
        down = _zcnet("lab", "down", doc["name"])
    assert down.returncode == 0, down.stderr
    assert _ours() == []


def test_killed_run_leaves_devices_that_lab_down_removes(no_leaks):
    code = ("from zcnet.lab import Lab; import sys, time\n"
            "lab = Lab(device='netdevsim').up(); print(lab.name, flush=True); time.sleep(600)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        name = child.stdout.readline().strip()
        assert name and len(_ours()) == 2
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert len(_ours()) == 2  # SIGKILL: nothing ran to remove them
    down = _zcnet("lab", "down")
    assert down.returncode == 0, down.stderr
    assert name in down.stdout
    assert _ours() == []


# --- NIC setup ---------------------------------------------------------------------------------

@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(setup.STATE_DIR_ENV, str(tmp_path))
    return tmp_path


REAL_NIC_PLAN = [f"channels {QUEUE + 1}", "tcp-data-split on", "hds-thresh 0",
                 "rx-ntuple-filter on", f"RSS off queue {QUEUE}",
                 f"tcp4 dst-port {PORT} -> queue {QUEUE}", f"tcp6 dst-port {PORT} -> queue {QUEUE}"]


def test_setup_applies_the_real_nic_plan_and_restore_puts_it_back(lab, state_dir):
    with Device.open(lab.if_b, lab.ns_b) as dev:
        ethtool.rings_set(dev, **{"tcp-data-split": "off"})
        ethtool.channels_set(dev, combined_count=1)
        before = _state(dev)
        assert before["tcp-data-split"] == "off" and before["rules"] == 0
        cfg = setup.NicConfig(lab.if_b, QUEUE, PORT, netns=lab.ns_b)
        # netdevsim (zcnet's kernel) has ntuple and RSS: the steps a real NIC gets, all of them
        assert [s.title for s in setup.apply(cfg, device=dev)] == REAL_NIC_PLAN
        after = _state(dev)
        assert after["tcp-data-split"] == "on" and after["hds-thresh"] == 0
        assert after["channels"] == QUEUE + 1 and "rx-ntuple-filter" in after["features"]
        assert after["rules"] == 2 and QUEUE not in after["rss"]
        setup.restore(lab.if_b, lab.ns_b, device=dev)
        assert _state(dev) == before


@pytest.mark.parametrize("rss_context", [False, True], ids=["rss", "rss-context"])
def test_setup_steers_the_port_to_the_queue_and_restore_undoes_it(lab, state_dir, rss_context):
    """Traffic to the port lands on the chosen queue only (the driver's per-queue counters);
    with RSS moved off that queue, other flows land elsewhere; restore puts it all back."""
    with Device.open(lab.if_b, lab.ns_b) as dev:
        before = _state(dev)
        cfg = setup.NicConfig(lab.if_b, QUEUE, PORT, netns=lab.ns_b, rss_context=rss_context)
        with setup.applied(cfg):
            if rss_context:
                assert [c["indir"] for c in ethtool.rss_contexts(dev)] == [[QUEUE] * 128]
            start = _rx_bytes(dev)
            _stream(lab, 1 << 20, PORT)
            _stream(lab, 1 << 20, PORT, v6=True)
            to_port = _delta(dev, start)
            assert to_port[QUEUE] >= 2 << 20, to_port
            assert all(n < BACKGROUND for q, n in to_port.items() if q != QUEUE), to_port
            if not rss_context:  # the default context no longer spreads onto QUEUE
                start = _rx_bytes(dev)
                for port in OTHER_PORTS:
                    _stream(lab, 256 << 10, port)
                elsewhere = _delta(dev, start)
                assert elsewhere[QUEUE] < BACKGROUND, elsewhere
                assert sum(elsewhere.values()) >= len(OTHER_PORTS) * (256 << 10)
        assert _state(dev) == before


# Several queues by a rule per port go through the CLI in the 8-flow client test below (setup
# and restore); the Python API runs every plan step by step in the rollback tests.
@pytest.mark.parametrize("queues", [("--queue", str(QUEUE), "--port", str(PORT)),
                                    ("--queues", "2-3", "--port", str(PORT), "--rss-context")],
                         ids=["one", "rss-context"])
def test_cli_setup_restore_doctor_passes_in_between(lab, state_dir, queues):
    args = (lab.if_b, "--netns", lab.ns_b)
    which = queues[:2]
    with Device.open(lab.if_b, lab.ns_b) as dev:
        ethtool.rings_set(dev, **{"tcp-data-split": "off"})
        before = _state(dev)
    doc = _zcnet("nic", "doctor", *args, *which, "--json")
    assert doc.returncode == 1  # HDS is off yet
    st = _zcnet("nic", "setup", *args, *queues)
    assert st.returncode == 0, st.stderr
    try:
        doc = _zcnet("nic", "doctor", *args, *which, "--json")
        checks = {c["check"]: c for c in json.loads(doc.stdout)["results"]}
        assert doc.returncode == 0, [c for c in checks.values() if c["status"] != "pass"]
        qops = checks["driver: queue management ops"]
        assert qops["status"] == "pass" and "the kernel bound a dma-buf" in qops["detail"]
    finally:
        rs = _zcnet("nic", "restore", *args)
    assert rs.returncode == 0, rs.stderr
    with Device.open(lab.if_b, lab.ns_b) as dev:
        assert _state(dev) == before and before["tcp-data-split"] == "off"


CONFIGS = {"one-queue": ((QUEUE,), (PORT,), False, len(REAL_NIC_PLAN)),
           # RSS off both, then a rule per port and flow type
           "rule-per-port": (SET, SET_PORTS[:4], False, 5 + 4 * 2),
           # RSS off both, a context over them, a rule per flow type to it
           "rss-context": (SET, (PORT,), True, 5 + 1 + 2)}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("how", ["error", "interrupt"])
def test_interrupt_at_each_step_leaves_the_device_identical(lab, state_dir, how, config):
    queues, ports, rss_context, steps = CONFIGS[config]
    with Device.open(lab.if_b, lab.ns_b) as dev:
        ethtool.channels_set(dev, combined_count=1)
        before = _state(dev)
        cfg = setup.NicConfig(lab.if_b, queues, ports, netns=lab.ns_b, rss_context=rss_context)
        count = len(setup.plan(dev, cfg))
        assert count == steps
        for at in range(count):
            def hook(i, step, at=at):
                if i == at:
                    raise KeyboardInterrupt if how == "interrupt" else ZcnetError("injected")

            with pytest.raises((KeyboardInterrupt, ZcnetError)):
                setup.apply(cfg, before_step=hook, device=dev)
            assert _state(dev) == before, f"after a {how} at step {at}"
            assert setup.load_state(lab.if_b, lab.ns_b) is None


# --- several queues (issue 36) -------------------------------------------------------------------

@pytest.mark.parametrize("rss_context", [False, True], ids=["rule-per-port", "rss-context"])
def test_several_queues_take_the_ports_flows_and_arrived_on_names_each(lab, state_dir,
                                                                       rss_context):
    """`nic setup` for queues 2,3: every flow to the set-up ports lands on one of them (the
    driver's per-queue counters), the one `arrived_on` names; with a rule per port, port i on
    queue 2 + i mod 2; through an RSS context, 16 flows to one port reach both (all on one
    queue: a chance of 2^-15). Flows to other ports stay off them; restore puts RSS, the
    context, the rules, HDS and the channel count back exactly."""
    ports = (PORT,) * 16 if rss_context else SET_PORTS
    with Device.open(lab.if_b, lab.ns_b) as dev:
        ethtool.channels_set(dev, combined_count=2)   # setup raises it to 4
        before = _state(dev)
        cfg = setup.NicConfig(lab.if_b, SET, sorted(set(ports)), netns=lab.ns_b,
                              rss_context=rss_context)
        with setup.applied(cfg):
            if rss_context:
                assert [c["indir"] for c in ethtool.rss_contexts(dev)] == [[2, 3] * 64]
            assert not set(SET) & set(ethtool.rss_get(dev)["indir"])
            seen = []
            for port in ports:
                start = _rx_bytes(dev)
                with _received(lab, 256 << 10, port) as conn:
                    queue = arrived_on(conn, cfg)
                landed = _delta(dev, start)
                assert landed[queue] >= 256 << 10, (queue, landed)
                assert sum(n for q, n in landed.items() if q != queue) < BACKGROUND, landed
                seen.append(queue)
            if rss_context:
                assert set(seen) == set(SET), seen
            else:
                assert seen == [cfg.queue_of(p) for p in ports] == [2, 3] * 4
            start = _rx_bytes(dev)
            for port in OTHER_PORTS:
                _stream(lab, 256 << 10, port)
            elsewhere = _delta(dev, start)
            assert all(elsewhere[q] < BACKGROUND for q in SET), elsewhere
            assert sum(elsewhere.values()) >= len(OTHER_PORTS) * (256 << 10)
        assert _state(dev) == before
    assert Counter(seen)[2] >= 1 and Counter(seen)[3] >= 1


def test_a_connection_outside_the_set_queues_is_a_clear_error(lab, state_dir):
    """A connection to a port nobody steered lands where RSS sends it (not queues 2,3):
    `arrived_on` names that queue (the one the counters saw), the NIC, and the setup that
    would fix it; one to a port the caller believes set up says another rule or RSS took it."""
    cfg = setup.NicConfig(lab.if_b, SET, PORT, netns=lab.ns_b, rss_context=True)
    other = OTHER_PORTS[0]
    with Device.open(lab.if_b, lab.ns_b) as dev, setup.applied(cfg):
        start = _rx_bytes(dev)
        with _received(lab, 256 << 10, other) as conn:
            with pytest.raises(WrongQueue) as unset:
                arrived_on(conn, cfg)
            believed = setup.NicConfig(lab.if_b, SET, (PORT, other), netns=lab.ns_b,
                                       rss_context=True)
            with pytest.raises(WrongQueue) as taken:
                arrived_on(conn, believed)
            host, sport = conn.getpeername()
        landed = _delta(dev, start)
    queue = max(landed, key=landed.__getitem__)
    assert queue not in SET and landed[queue] >= 256 << 10
    assert (unset.value.ifname, unset.value.queue) == (lab.if_b, queue)
    assert unset.value.message == (f"connection from {host}:{sport} to port {other} arrived on "
                                   f"{lab.if_b} queue {queue}, not on the zcrx {lab.if_b} "
                                   "queues 2,3")
    assert unset.value.hint == (
        f"steer port {other} to queues 2,3 with `zcnet nic setup {lab.if_b} --netns {lab.ns_b} "
        f"--queues 2,3 --port {PORT},{other} --rss-context` (after `zcnet nic restore "
        f"{lab.if_b} --netns {lab.ns_b}`), or connect to port {PORT}")
    assert taken.value.message == unset.value.message
    assert taken.value.hint == (
        f"port {other} is set up for {lab.if_b} queues 2,3, yet another flow rule or RSS took "
        f"it: check with `zcnet nic show {lab.if_b} --netns {lab.ns_b}` and `zcnet nic doctor "
        f"{lab.if_b} --netns {lab.ns_b} --queues 2,3`")


# devmem and zcrx: the steering under test is the NIC's, the same for every engine; both add
# eight flow workers on queues their session holds (zcnet.bench.devmem_flows: one binding of
# both queues; zcnet.bench.zcrx_flows: one zcrx per queue, imported by each worker). (soft-zc
# ran here too; it added 80 s of TCG and no check.)
@pytest.mark.parametrize("engine", ["devmem", "zcrx"])
def test_cli_client_8_flows_over_two_queues_verified(lab, state_dir, tmp_path, engine):
    """The commands a user types: `zcnet nic setup --queues 1,2 --port 9000-9007` on side b,
    a `zcnet server` on each side, then `zcnet client -n 8 --data-port 9000 --verify` from
    side a: every flow's bytes checked, flows 0,2,4,6 on queue 1 and 1,3,5,7 on queue 2 (the
    driver's per-queue counters); the control connections stay on queues 0 and 3. Both with
    `--rx-opt ifname=... --rx-opt queues=1,2`. devmem: the server binds one dma-buf to both
    queues once, its eight flow workers receive on it (eight members), every payload byte in
    a dma-buf page (linear 0). zcrx: the server registers each queue once (in a memfd) and
    each worker imports both and joins the one its connection arrived on; the kernel copied
    nothing. The queues are free again after the run."""
    token = tmp_path / "token"
    secret = os.urandom(32).hex().encode()
    token.write_bytes(secret + b"\n")
    token.chmod(0o600)
    st = _zcnet("nic", "setup", lab.if_b, "--netns", lab.ns_b, "--queues", "1,2",
                "--port", "9000-9007")
    assert st.returncode == 0, st.stderr
    with ExitStack() as stack:
        stack.callback(lambda: _zcnet("nic", "restore", lab.if_b, "--netns", lab.ns_b))
        src = stack.enter_context(NetnsServer(host=lab.addr_a, netns=lab.ns_a, token=secret))
        dst = stack.enter_context(NetnsServer(host=lab.addr_b, netns=lab.ns_b, token=secret))
        dev = stack.enter_context(Device.open(lab.if_b, lab.ns_b))
        start = _rx_bytes(dev)
        out = tmp_path / "client.json"
        opts = ["--rx-opt", f"ifname={lab.if_b}", "--rx-opt", "queues=1,2"]
        proc = netns_popen(lab.ns_a, [sys.executable, "-m", "zcnet", "client", "--src",
                                      str(src.address), "--dst", str(dst.address),
                                      "--token-file", str(token), "-n", "8", "-t", "1",
                                      "--data-port", "9000", "--rx-engine", engine, *opts,
                                      "--verify", "--json", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, stderr = proc.communicate(timeout=600)
        landed = _delta(dev, start)
        bound = [q for q in (1, 2) if {"dmabuf", "io-uring"} & set(netdev.queue_get(dev, q))]
    assert proc.returncode == 0, stderr[-2000:]
    flows = json.loads(out.read_text())["results"]
    assert sorted(f["flow"] for f in flows) == list(range(8))
    for f in flows:
        assert f["status"] == "ok" and f["engine"] == engine, f
        assert f["verify"] == {"checked_bytes": f["bytes"], "mismatches": 0} and f["bytes"] > 0
    want = {q: sum(f["bytes"] for f in flows if f["flow"] % 2 == q - 1) for q in (1, 2)}
    assert all(landed[q] >= n for q, n in want.items()), (want, landed)
    assert landed[0] + landed[3] < sum(want.values()) // 20, (want, landed)   # control only
    assert bound == []   # the session's binding went with its flows
    if engine == "devmem":
        for f in flows:
            st = f["engine_stats"]
            assert st["linear"] == 0 and st["kernel_copied_bytes"] == 0, st
            assert st["members"] == 8 and st["delivered"] == st["released"] > 0, st
    else:
        for f in flows:
            st = f["engine_stats"]
            assert st["zcrx_copy"] == 0 and st["kernel_copied_bytes"] == 0, st
            assert st["delivered"] == st["released"] > 0, st


def test_page_pools_stats_and_queue_map(lab):
    with Device.open(lab.if_b, lab.ns_b) as dev:
        pools = netdev.page_pools(dev)
        assert len(pools) == QUEUES
        stats = netdev.page_pool_stats(dev)
        assert {s["info"]["id"] for s in stats} == {p["id"] for p in pools}
        rows = [r for r in info.queue_map(dev) if r["type"] == "rx"]
        assert [r["id"] for r in rows] == list(range(QUEUES))
        by_napi = {p["napi-id"]: p["id"] for p in pools}
        for row in rows:
            assert row["napi"] and row["page_pools"] == [by_napi[row["napi"]]]
    show = _zcnet("nic", "show", lab.if_b, "--netns", lab.ns_b, "--json")
    assert show.returncode == 0, show.stderr
    queues = json.loads(show.stdout)["results"][0]["queues"]
    assert all(q["page_pools"] for q in queues if q["type"] == "rx")


# --- zcrx and devmem on an RX queue --------------------------------------------------------------

@pytest.fixture
def ready(lab, state_dir) -> Iterator[Lab]:
    """`nic setup` for QUEUE and PORT on side b: HDS on, hds-thresh 0, ntuple rules steering
    PORT to QUEUE and RSS moved off it."""
    with setup.applied(setup.NicConfig(lab.if_b, QUEUE, PORT, netns=lab.ns_b)):
        yield lab


def _receive(lab: Lab, total: int, provider: str, port: int = PORT,
             **kw: object) -> tuple[dict[str, object], int]:
    """Register ``provider`` on QUEUE of side b before any data is sent, then receive ``total``
    pattern bytes to EOF, checking each chunk where it lies in the registered memory;
    (stats, bytes checked). While registered, the kernel shows the binding on the queue."""
    client, server = _pair(lab, port)
    sender = Sender(client, total)  # closes the client when done
    with ExitStack() as stack:
        stack.enter_context(server)
        stack.callback(client.close)
        with in_netns(lab.ns_b):
            rx = stack.enter_context(open_receiver(server, provider, ifname=lab.if_b,
                                                   queue=QUEUE, **kw))
        assert NETDEVSIM_DMA_NOTE in rx.why and rx.stats_dict()["why"] == rx.why
        with Device.open(lab.if_b, lab.ns_b) as dev:
            bound = netdev.queue_get(dev, QUEUE)
        if provider == "zcrx":
            assert bound["io-uring"] == {"rx-buf-len": rx.provider.buf_len}
        else:
            assert bound["dmabuf"] == rx.provider.binding.id
        sender.start()
        got = check_to_eof(rx)
        sender.join(300)
        stats = rx.stats_dict()
    assert sender.error is None, sender.error
    with Device.open(lab.if_b, lab.ns_b) as dev:  # unbound with the receiver
        assert not {"io-uring", "dmabuf"} & set(netdev.queue_get(dev, QUEUE))
    return stats, got


def test_zcrx_on_an_rx_queue_receives_with_no_kernel_copy(ready):
    """64 MiB through an area of 16: every byte DMA'd (by the scaffolding) into buffers the
    queue's page pool took from zcrx, none copied by the kernel (its own counter), and the
    buffers came back through the refill ring, read by the pool: no flush."""
    total, area = 64 << 20, 16 << 20
    with Device.open(ready.if_b, ready.ns_b) as dev:
        before = _rx_bytes(dev)
        stats, got = _receive(ready, total, "zcrx", area_size=area)
        landed = _delta(dev, before)
    assert got == total, stats
    assert stats["kernel_copied_bytes"] == 0 and stats["zero_copy_share"] == 1.0, stats
    assert stats["kernel_copied_source"] == "zcrx_stats.copy_bytes"
    assert stats["zcrx_flushes"] == 0 and stats["exhausted"] == 0, stats
    assert landed[QUEUE] >= total and sum(landed.values()) - landed[QUEUE] < BACKGROUND
    # Every 4 KiB buffer went back through the refill ring, 4x the area's worth, and only the
    # pool read the ring (no flush): it took all but what it had no use for yet.
    buffers = total // stats["rx_buf_len"]
    assert stats["refill_produced"] >= buffers, stats
    assert stats["refill_consumed"] >= stats["refill_produced"] - area // stats["rx_buf_len"]


def _pairs(lab: Lab, n: int, stack: ExitStack) -> list[tuple[socket.socket, socket.socket]]:
    """``n`` (server, client) connections to PORT, closed with ``stack``."""
    pairs = []
    for _ in range(n):
        client, server = _pair(lab, PORT)
        stack.enter_context(server)
        stack.callback(client.close)
        pairs.append((server, client))
    return pairs


def _alloc_fails(dev: Device) -> int:
    """Packets QUEUE dropped for want of a buffer (the patched driver's rx-alloc-fail)."""
    return sum(r.get("rx-alloc-fail", 0) for r in netdev.qstats(dev)
               if r.get("queue-type") == "rx" and r.get("queue-id") == QUEUE)


def test_64_connections_share_one_device_queue_with_no_copy_and_no_drop(ready):
    """64 connections steered to QUEUE share one zcrx registration (a second one would be
    EEXIST): every byte verified where the device wrote it, none copied by the kernel (its
    counter for the queue stays 0, so each connection's is 0), no packet dropped for want of
    a buffer, no connection ever holding more than its share; the queue unbound at the end."""
    n, total = 64, 256 << 10
    with ExitStack() as stack:
        pairs = _pairs(ready, n, stack)
        with in_netns(ready.ns_b):  # where a join can ask which queue a connection came on
            zq = stack.enter_context(open_zcrx_queue(16 * MIB, ifname=ready.if_b, queue=QUEUE))
            srv = ZcrxServer(zq, [s for s, _ in pairs])
        assert "shared by 64 connections" in srv.rx[0].provider.note
        with Device.open(ready.if_b, ready.ns_b) as dev:
            assert netdev.queue_get(dev, QUEUE)["io-uring"] == {"rx-buf-len": zq.buf_len}
            before, fails = _rx_bytes(dev), _alloc_fails(dev)
            sender = send_from_child([c for _, c in pairs], total)
            srv.run(lambda: all(map(srv.finished, range(n))), timeout=600)
            landed, dropped = _delta(dev, before), _alloc_fails(dev) - fails
        sender.join(60)
        assert sender.exitcode == 0
        assert srv.got == [total] * n and not srv.errors
        assert landed[QUEUE] >= n * total and dropped == 0, (landed, dropped)
        assert zq.copied()[1] == 0
        assert all(rx.stats_dict()["kernel_copied_bytes"] == 0 for rx in srv.rx)
        assert 0 < srv.most_held <= zq.share_bytes()
        for rx in srv.rx:
            rx.close()
    with Device.open(ready.if_b, ready.ns_b) as dev:
        assert "io-uring" not in netdev.queue_get(dev, QUEUE)


def test_a_connection_on_another_queue_cannot_join_the_zcrx_queue(ready):
    """A flow that RSS put on another queue would end with -EFAULT at its first buffer: the
    join is refused before any receive is armed, naming where it arrived and the fix."""
    client, server = _pair(ready, OTHER_PORTS[0])
    with ExitStack() as stack:
        stack.enter_context(server)
        stack.callback(client.close)
        client.sendall(b"x")  # its first packet gives it a NAPI id
        assert server.recv(1, socket.MSG_PEEK) == b"x"
        with in_netns(ready.ns_b):
            zq = stack.enter_context(open_zcrx_queue(4 * MIB, ifname=ready.if_b, queue=QUEUE))
            with pytest.raises(WrongQueue) as ei:
                zq.join(server.fileno())
        e = ei.value
        assert e.ifname == ready.if_b and e.queue not in (None, QUEUE)
        assert e.message == (f"the connection on fd {server.fileno()} arrived on {ready.if_b} "
                             f"queue {e.queue}, not on {ready.if_b} queue {QUEUE}, whose zcrx "
                             "queue it joined")
        assert e.hint.startswith(f"steer its port to {ready.if_b} queue {QUEUE} (`zcnet nic "
                                 f"setup {ready.if_b} --queues {QUEUE} --port PORT`)")
        assert not zq.members and zq.mem.members == 0


@pytest.fixture
def huge_pages() -> Iterator[None]:
    """Eight 2 MiB pages for a hugetlb area (the guest's memory; put back afterwards)."""
    knob = Path("/proc/sys/vm/nr_hugepages")
    prior = knob.read_text()
    knob.write_text("8")
    try:
        if int(knob.read_text()) < 8:
            pytest.skip("the guest could not reserve eight 2 MiB pages")
        yield
    finally:
        knob.write_text(prior)


def test_zcrx_rx_buf_len_above_a_page(ready, huge_pages):
    """A 16 KiB rx_buf_len: the queue's page pool is restarted with 16 KiB buffers (netdevsim's
    queue config op), the kernel reports that size, and nothing is copied."""
    stats, got = _receive(ready, 8 << 20, "zcrx", area_size=8 * HUGE_2MB, hugetlb=True,
                          rx_buf_len=16384)
    assert got == 8 << 20 and stats["rx_buf_len"] == 16384, stats
    assert stats["kernel_copied_bytes"] == 0, stats


def test_devmem_receives_every_payload_byte_in_dmabuf_frags(ready):
    """Every payload byte arrives as a dma-buf fragment (no SCM_DEVMEM_LINEAR byte), read
    back from the udmabuf; the binding goes with the receiver."""
    fd = udmabuf_create(8 << 20)
    try:
        stats, got = _receive(ready, 4 << 20, "devmem", dmabuf_fd=fd, area_size=8 << 20)
        with Device.open(ready.if_b, ready.ns_b) as dev:
            assert "dmabuf" not in netdev.queue_get(dev, QUEUE)
    finally:
        os.close(fd)
    assert got == 4 << 20 and stats["linear"] == 0, stats
    assert stats["kernel_copied_bytes"] == 0 and stats["zero_copy_share"] == 1.0, stats


def test_devmem_connections_on_one_queue_share_one_binding_each_within_its_share(ready):
    """Four connections to PORT (steered to QUEUE) open devmem receivers: one bind-rx (the
    queue shows one dma-buf), four members of its 8 MiB (2 MiB kept for the RX ring: 1.5 MiB
    each). One holds every chunk it gets: it stops at its share (pages held <= held_limit
    after every receive) while the other three get their 1 MiB each, verified, every payload
    byte in a dma-buf page. Closed with its chunks held, it keeps its socket: a fifth
    connection's 1 MiB flows through the pool meanwhile, and the held chunks keep their bytes
    (pages go back to the pool only on release). The last release and close unbind; a queue
    another program bound is refused saying so, with EEXIST."""
    lab = ready
    total, area = 1 << 20, 8 << 20
    rxs, senders, servers = [], [], []
    with ExitStack() as stack:
        def connect(n: int):  # type: ignore[no-untyped-def]
            client, server = _pair(lab, PORT)
            stack.enter_context(server)
            servers.append(server)
            stack.callback(client.close)
            with in_netns(lab.ns_b):
                rx = stack.enter_context(open_receiver(server, "devmem", ifname=lab.if_b,
                                                       queue=QUEUE, area_size=area))
            senders.append(Sender(client, n))
            rxs.append(rx)
            return rx

        hog = connect(2 * total)
        others = [connect(total) for _ in range(3)]
        binding = hog.provider.binding
        assert all(rx.provider.binding is binding for rx in others)
        assert binding.members == 4 and binding.reserve > 0
        with Device.open(lab.if_b, lab.ns_b) as dev:
            assert netdev.queue_get(dev, QUEUE)["dmabuf"] == binding.id
        limit = binding.held_limit()
        assert limit == (area - binding.reserve) // 4 // 2 // 4096
        for s in senders:
            s.start()
        held = []
        while hog.provider.share_stops == 0:
            held += hog.recv(0.2)
            assert hog.provider.held <= limit
        for rx in others:
            assert check_to_eof(rx) == total
            assert rx.stats_dict()["linear"] == 0 and hog.provider.held <= limit
        for c in held:
            check(c)
        hog_sock = hog.provider._sock
        hog.close()   # with its chunks held
        servers[0].close()   # the application's socket too: only the receiver's duplicate left
        assert hog_sock.fileno() >= 0 and binding.members == 3
        extra = connect(total)
        senders[-1].start()
        assert check_to_eof(extra) == total and extra.stats_dict()["linear"] == 0
        for c in held:
            check(c)   # still its bytes: the pool did not get its pages back
        hog.release_many(held)
        assert hog_sock.fileno() == -1 and hog.provider.held == 0
        for rx in rxs:
            rx.close()
        with Device.open(lab.if_b, lab.ns_b) as dev:
            assert "dmabuf" not in netdev.queue_get(dev, QUEUE)
            # Another program's binding (a raw bind-rx, not this process's registry): refused
            # by name, the kernel's errno kept.
            fd = udmabuf_create(1 << 20)
            stack.callback(os.close, fd)
            with netdev.bind_rx(dev, fd, [QUEUE]), pytest.raises(ZcnetError) as ei:
                connect(total)
            assert getattr(ei.value, "errno", None) == errno.EEXIST
            assert ei.value.message.startswith(f"queue {QUEUE} of {lab.if_b} is bound by another "
                                               "program (zcrx or devmem) or an XDP program")
    assert binding.closed
    for s in senders[1:]:
        s.join(60)
        assert s.error is None, s.error
    senders[0].join(60)   # the hog's unread rest: its peer reset it at close
    assert senders[0].error is None or isinstance(senders[0].error, ConnectionError)


@pytest.mark.parametrize("provider", ["zcrx", "devmem"])
def test_a_flow_on_a_queue_without_the_provider_is_copied_and_counted(ready, provider, caplog):
    """The provider holds QUEUE but the flow lands on another queue (no rule for its port, RSS
    spreads it elsewhere), whose pool has no provider. zcrx: its queue is known from the
    handshake, so the open is refused (WrongQueue) rather than every byte copied. devmem: the
    kernel copies (SCM_DEVMEM_LINEAR), and the receiver counts every byte as copied."""
    if provider == "zcrx":
        client, server = _pair(ready, OTHER_PORTS[0])
        with server, client, in_netns(ready.ns_b), pytest.raises(WrongQueue) as ei:
            open_receiver(server, "zcrx", ifname=ready.if_b, queue=QUEUE, area_size=4 << 20)
        assert ei.value.ifname == ready.if_b and ei.value.queue not in (None, QUEUE)
        with Device.open(ready.if_b, ready.ns_b) as dev:  # nothing stayed registered
            assert "io-uring" not in netdev.queue_get(dev, QUEUE)
        return
    kw: dict[str, object] = {"area_size": 4 << 20}
    with ExitStack() as stack:
        if provider == "devmem":
            fd = udmabuf_create(4 << 20)
            stack.callback(os.close, fd)
            kw["dmabuf_fd"] = fd
        caplog.set_level(logging.WARNING, logger="zcnet.rx.zc.devmem")
        stats, got = _receive(ready, 1 << 20, provider, port=OTHER_PORTS[0], **kw)
    assert got == 1 << 20
    assert stats["kernel_copied_bytes"] == 1 << 20 and stats["zero_copy_share"] == 0.0, stats
    if provider == "devmem":  # said once, in one line
        warned = [r.getMessage() for r in caplog.records if "SCM_DEVMEM_LINEAR" in r.getMessage()]
        assert len(warned) == 1 and "\n" not in warned[0]


def test_bind_rx_on_a_wrong_queue_fails_with_the_kernels_answer(ready):
    lab = ready
    fd = udmabuf_create(1 << 20)
    try:
        with Device.open(lab.if_b, lab.ns_b) as dev:
            # Out of range: the kernel answers EINVAL and points at the queue-id attribute
            # (NL_SET_BAD_ATTR, no message text).
            with pytest.raises(ZcnetError) as ei:
                netdev.bind_rx(dev, fd, [QUEUES + 3])
            assert ei.value.errno == errno.EINVAL
            # A queue already holding a provider: the kernel's extack says so.
            with netdev.bind_rx(dev, fd, [QUEUE]):
                other = udmabuf_create(1 << 20)
                try:
                    with pytest.raises(ZcnetError) as ei:
                        netdev.bind_rx(dev, other, [QUEUE])
                finally:
                    os.close(other)
            assert "already memory provider bound" in str(ei.value)
    finally:
        os.close(fd)


def test_bench_zcrx_and_devmem_cells_are_ok_and_labelled(no_leaks, tmp_path):
    out = tmp_path / "bench.json"
    # Sent from a udmabuf by devmem TX as well: one bench run covers both directions' device
    # paths (the netdevsim kernel has netmem TX; tests/tx/test_tx_devmem_vm.py has the rest).
    r = _zcnet("bench", "--lab-device", "netdevsim", "--queue", "1", "--engine", "zcrx,devmem",
               "--tx", "devmem", "--mtu", "1500", "--placement", "same", "--duration", "1",
               "--verify", "--json", str(out), timeout=900)
    assert r.returncode == 0, r.stderr
    cells = {c["engine"]: c for c in json.loads(out.read_text())["results"]}
    for engine in ("zcrx", "devmem"):
        cell = cells[engine]
        assert cell["status"] == "ok", cell.get("reason")
        assert cell["note"] == NETDEVSIM_DMA_NOTE
        assert cell["verify"]["mismatches"] == 0 and cell["verify"]["checked_bytes"] > 0
        # The kernel's copies travel with the cell: none (registered before the flow began).
        st = cell["engine_stats"]
        assert st["kernel_copied_bytes"] == 0 and st["zero_copy_share"] == 1.0, st
        # Every send went out of the dma-buf and completed as zero-copy; none is pending.
        tx = cell["tx_stats"]
        assert tx["path"] == "devmem" and tx["pending"] == 0 and tx["copied"] == 0, tx
        assert tx["zerocopy"] == tx["sends"] > 0, tx
    zcrx = cells["zcrx"]
    assert zcrx["zcrx_mode"] == "device" and zcrx["engine_stats"]["zcrx_copy"] == 0
    assert _ours() == []


def _reproduce(lab: Lab, tmp_path: Path, name: str) -> tuple[dict, str]:
    """`zcnet reproduce NAME` in its real-NIC form: side b receives on its netdevsim port (set
    up by ``ready``), side a runs the sending `zcnet server`; the JSON and Markdown written."""
    token = tmp_path / "token"
    out = tmp_path / "out"
    with NetnsServer(host=lab.addr_a, netns=lab.ns_a) as server:
        token.write_bytes(server.token + b"\n")
        token.chmod(0o600)
        proc = netns_popen(lab.ns_b, [sys.executable, "-m", "zcnet", "reproduce", name,
                                      "--ifname", lab.if_b, "--remote", str(server.address),
                                      "--token-file", str(token), "--queue", str(QUEUE),
                                      "--data-port", str(PORT),
                                      "--duration", "0.5", "--repeat", "1", "--out", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, stderr = proc.communicate(timeout=1200)
    assert proc.returncode == 0, stderr[-2000:]
    return json.loads((out / f"{name}.json").read_text()), (out / f"{name}.md").read_text()


def test_reproduce_mlx5_zcrx_on_a_netdevsim_queue(ready, tmp_path):
    """The real-NIC form of `zcnet reproduce mlx5-zcrx`: side b receives on its netdevsim port
    (`nic setup`: HDS on, the data port's flow rule to QUEUE, RSS off it), side a runs the
    sending `zcnet server`; no substitutions, and the kernel copies nothing."""
    doc, md = _reproduce(ready, tmp_path, "mlx5-zcrx")
    cells = doc["results"]
    assert not doc.get("substitutions"), doc.get("substitutions")
    # Rows at the ports' MTU run; the spec's other MTUs are refused naming the fix, as on a NIC.
    here = [c for c in cells if c.get("mtu", 1500) == 1500 and "peer" not in c]
    assert {c.get("engine") for c in here} == {"epoll", "uring", "zcrx"}
    assert all(c["status"] == "ok" for c in here), [c.get("reason") for c in here]
    for c in cells:
        if c.get("mtu", 1500) != 1500 and "peer" not in c:
            assert c["status"] != "ok" and f"needs {c['mtu']}" in c["reason"], c
    zcrx = [c for c in here if c["engine"] == "zcrx"]
    assert all(c["zcrx_mode"] == "device" and c["note"] == NETDEVSIM_DMA_NOTE
               for c in zcrx), zcrx
    assert all(c["engine_stats"]["kernel_copied_bytes"] == 0 for c in zcrx), zcrx
    # The report says so per row: the zcrx column of the 1500 row reads 100% zero-copy.
    row = next(line for line in md.splitlines() if line.startswith("| 1500 "))
    assert row.rstrip(" |").endswith("100% zero-copy"), row


def test_reproduce_zcrx_refs_on_a_netdevsim_queue_reports_the_share_per_row(ready, tmp_path):
    """`zcnet reproduce zcrx-refs` on the netdevsim port: real zcrx (no substitution) in each
    placement x consumer cell, every row 100% zero-copy by the kernel's own counter."""
    doc, md = _reproduce(ready, tmp_path, "zcrx-refs")
    assert not doc.get("substitutions"), doc.get("substitutions")
    cells = doc["results"]
    assert len(cells) == 4 and all(c["status"] == "ok" for c in cells), cells
    for c in cells:
        assert c["engine"] == "zcrx" and c["zcrx_mode"] == "device", c
        assert c["engine_stats"]["kernel_copied_bytes"] == 0, c["engine_stats"]
    rows = [line for line in md.splitlines() if line.startswith(("| same ", "| split "))]
    # Two placements x two consumers: each cell of each row reads 100% zero-copy.
    assert len(rows) == 2 and all(line.count("100% zero-copy") == 2 for line in rows), md



@pytest.mark.parametrize("provider,n", [("zcrx", 16), ("devmem", 1)])
def test_aio_receivers_on_a_device_queue_verified_with_no_copy(ready, provider, n):
    """zcnet.aio in device mode: ``n`` connections steered to QUEUE, each an
    aio.open_receiver(provider, ifname, queue) on the loop (zcrx: every one on the loop thread's
    one registration of the queue), drained with ``async for``: every byte verified where the
    device wrote it, none copied by the kernel; the queue unbound once they close."""
    import asyncio

    from zcnet import aio

    total = 1 * MIB
    with ExitStack() as stack:
        pairs = _pairs(ready, n, stack)
        for server, _ in pairs:
            server.setblocking(False)

        async def drain(i: int, rx: aio.AsyncReceiver) -> int:
            got = 0
            async for c in rx:
                assert PAT.matches(i * MIB + c.stream_offset, c.array), (i, c.stream_offset)
                got += c.length
                c.release()
            return got

        async def main() -> tuple[list[int], list[dict[str, object]], int]:
            with in_netns(ready.ns_b):
                rxs = [aio.open_receiver(s, provider, ifname=ready.if_b, queue=QUEUE,
                                         area_size=16 * MIB) for s, _ in pairs]
            try:
                if provider == "zcrx":
                    zq = rxs[0].rx.provider.zq
                    assert not zq.copy and all(r.rx.provider.zq is zq for r in rxs)
                sender = send_from_child([c for _, c in pairs], total)
                got = await asyncio.wait_for(
                    asyncio.gather(*(drain(i, r) for i, r in enumerate(rxs))), 600)
                stats = [r.rx.stats_dict() for r in rxs]
            finally:
                for r in rxs:
                    r.close()
            sender.join(60)
            return got, stats, sender.exitcode

        got, stats, code = asyncio.run(main())
    assert code == 0 and got == [total] * n, (got, code)
    for s in stats:
        assert NETDEVSIM_DMA_NOTE in str(s["why"]), s
        assert s["kernel_copied_bytes"] == 0, s
    with Device.open(ready.if_b, ready.ns_b) as dev:
        assert not {"io-uring", "dmabuf"} & set(netdev.queue_get(dev, QUEUE))
