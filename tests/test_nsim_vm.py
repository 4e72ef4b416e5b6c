"""For real on netdevsim: labs, NIC setup, zcrx on an RX queue, devmem. These run inside a VM
booted with zcnet's netdevsim test kernel (``zcnet vm build-kernel``); on the host they report
the inner outcome. netdevsim forwards the sender's pages, so every receive here is the kernel's
copy into the registered memory: registration and protocol are real, the DMA is not."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from zcnet.errors import ZcnetError
from zcnet.lab import Lab, netdevsim
from zcnet.netns import in_netns
from zcnet.nic import ethtool, info, netdev, setup
from zcnet.nic.device import Device
from zcnet.rx.zc import open_receiver
from zcnet.rx.zc.area import udmabuf_create

pytestmark = [pytest.mark.vm(kernel="nsim"), pytest.mark.root]

QUEUES = 4
QUEUE = 2
PAYLOAD = 4 << 20


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
    """What setup may change: rings (HDS), channels, active features."""
    rings = ethtool.rings_get(dev)
    feats = ethtool.features_get(dev)
    return {"tcp-data-split": rings.get("tcp-data-split"), "hds-thresh": rings.get("hds-thresh"),
            "channels": ethtool.channels_get(dev).get("combined-count"),
            "features": sorted(feats["active"].value)}


class _Sender:
    """Sends PAYLOAD from lab side a to a listener on side b once connected."""

    def __init__(self, lab: Lab, payload: bytes) -> None:
        with in_netns(lab.ns_b):
            self.listener = socket.create_server((lab.addr_b, 0))
        self.port = self.listener.getsockname()[1]
        self.lab, self.payload = lab, payload
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._send)

    def _send(self) -> None:
        try:
            with in_netns(self.lab.ns_a):
                client = socket.create_connection((self.lab.addr_b, self.port), timeout=120)
            with client:
                client.sendall(self.payload)
        except OSError as exc:
            self.error = exc

    def accept(self) -> socket.socket:
        self.thread.start()
        conn, _ = self.listener.accept()
        self.listener.close()
        return conn

    def join(self) -> None:
        self.thread.join(120)
        assert self.error is None, self.error


def _receive_all(rx, size: int) -> bytes:
    got = bytearray()
    deadline = time.monotonic() + 120
    while len(got) < size and time.monotonic() < deadline:
        batch = rx.recv_batch(timeout=5)
        if batch is None:
            if rx.eof:
                break
            continue
        for view in batch.views():
            got += view
        rx.release(batch)
    return bytes(got)


# --- the lab ---------------------------------------------------------------------------------

def test_netdevsim_lab_carries_tcp_on_its_queues(lab):
    assert lab.env()["netdevsim"] == [lab.if_a, lab.if_b]
    with Device.open(lab.if_b, lab.ns_b) as dev:
        assert dev.driver == "netdevsim"
        assert ethtool.channels_get(dev)["combined-count"] == QUEUES
    payload = os.urandom(1 << 20)
    sender = _Sender(lab, payload)
    conn = sender.accept()
    with conn:
        got = bytearray()
        while chunk := conn.recv(65536):
            got += chunk
    sender.join()
    assert bytes(got) == payload
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


def test_setup_turns_hds_on_and_restore_turns_it_back(lab, state_dir):
    with Device.open(lab.if_b, lab.ns_b) as dev:
        ethtool.rings_set(dev, **{"tcp-data-split": "off"})
        ethtool.channels_set(dev, combined_count=1)
        before = _state(dev)
        assert before["tcp-data-split"] == "off"
        cfg = setup.NicConfig(lab.if_b, QUEUE, 9999, netns=lab.ns_b)
        titles = [s.title for s in setup.apply(cfg, device=dev)]
        # netdevsim has no ntuple and no RSS: setup leaves those steps out (steered by the peer)
        assert titles == [f"channels {QUEUE + 1}", "tcp-data-split on", "hds-thresh 0"]
        after = _state(dev)
        assert after["tcp-data-split"] == "on" and after["hds-thresh"] == 0
        assert after["channels"] == QUEUE + 1
        setup.restore(lab.if_b, lab.ns_b, device=dev)
        assert _state(dev) == before


def test_cli_setup_restore_doctor_passes_in_between(lab, state_dir):
    args = (lab.if_b, "--netns", lab.ns_b)
    with Device.open(lab.if_b, lab.ns_b) as dev:
        ethtool.rings_set(dev, **{"tcp-data-split": "off"})
    doc = _zcnet("nic", "doctor", *args, "--queue", str(QUEUE), "--json")
    assert doc.returncode == 1  # HDS is off yet
    st = _zcnet("nic", "setup", *args, "--queue", str(QUEUE), "--port", "9999")
    assert st.returncode == 0, st.stderr
    try:
        doc = _zcnet("nic", "doctor", *args, "--queue", str(QUEUE), "--json")
        checks = {c["check"]: c for c in json.loads(doc.stdout)["results"]}
        assert doc.returncode == 0, [c for c in checks.values() if c["status"] != "pass"]
        qops = checks["driver: queue management ops"]
        assert qops["status"] == "pass" and "the kernel bound a dma-buf" in qops["detail"]
    finally:
        rs = _zcnet("nic", "restore", *args)
    assert rs.returncode == 0, rs.stderr
    with Device.open(lab.if_b, lab.ns_b) as dev:
        assert ethtool.rings_get(dev).get("tcp-data-split") == "off"


@pytest.mark.parametrize("how", ["error", "interrupt"])
def test_interrupt_at_each_step_leaves_the_device_identical(lab, state_dir, how):
    with Device.open(lab.if_b, lab.ns_b) as dev:
        ethtool.channels_set(dev, combined_count=1)
        before = _state(dev)
        cfg = setup.NicConfig(lab.if_b, QUEUE, 9999, netns=lab.ns_b)
        count = len(setup.plan(dev, cfg))
        assert count == 3
        for at in range(count):
            def hook(i, step, at=at):
                if i == at:
                    raise KeyboardInterrupt if how == "interrupt" else ZcnetError("injected")

            with pytest.raises((KeyboardInterrupt, ZcnetError)):
                setup.apply(cfg, before_step=hook, device=dev)
            assert _state(dev) == before, f"after a {how} at step {at}"
            assert setup.load_state(lab.if_b, lab.ns_b) is None


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
    """HDS on, hds-thresh 0, and side a transmitting on QUEUE (so b receives there)."""
    cfg = setup.NicConfig(lab.if_b, QUEUE, 9999, netns=lab.ns_b)
    with setup.applied(cfg):
        netdevsim.steer_tx(lab.ns_a, lab.if_a, QUEUE)
        yield lab


def test_zcrx_on_an_rx_queue_receives_verified_data(ready):
    lab = ready
    payload = os.urandom(PAYLOAD)
    sender = _Sender(lab, payload)
    conn = sender.accept()
    with ExitStack() as stack:
        stack.enter_context(conn)
        # A quarter of the payload: netdevsim's page pool never reads the refill ring, so the
        # kernel's copies run the area dry unless zcnet flushes the ring back to the free list.
        with in_netns(lab.ns_b):
            rx = open_receiver(conn, "zcrx", ifname=lab.if_b, queue=QUEUE,
                               area_size=PAYLOAD // 4)
        stack.enter_context(rx)
        assert "netdevsim forwards the sender's pages" in rx.why
        assert rx.stats_dict()["why"] == rx.why
        with Device.open(lab.if_b, lab.ns_b) as dev:
            assert "io-uring" in netdev.queue_get(dev, QUEUE)
        got = _receive_all(rx, PAYLOAD)
        stats = rx.stats_dict()
        sender.join()
    assert len(got) == PAYLOAD, stats
    assert got == payload
    assert stats["rearms"] >= 1, stats  # the area ran dry and was refilled
    with Device.open(lab.if_b, lab.ns_b) as dev:
        assert "io-uring" not in netdev.queue_get(dev, QUEUE)


def test_devmem_bind_rx_receive_and_unbind_on_close(ready):
    lab = ready
    payload = os.urandom(1 << 20)
    sender = _Sender(lab, payload)
    conn = sender.accept()
    fd = udmabuf_create(8 << 20)
    with ExitStack() as stack:
        stack.callback(os.close, fd)
        stack.enter_context(conn)
        with in_netns(lab.ns_b):
            rx = open_receiver(conn, "devmem", dmabuf_fd=fd, ifname=lab.if_b, queue=QUEUE,
                               area_size=8 << 20)
        stack.enter_context(rx)
        with Device.open(lab.if_b, lab.ns_b) as dev:
            assert "dmabuf" in netdev.queue_get(dev, QUEUE)
        got = _receive_all(rx, len(payload))
        sender.join()
        stats = rx.stats_dict()
    assert got == payload
    # What netdevsim delivers: the sender's pages, never dma-buf frags, so all of it arrives
    # as ordinary (readable) data; the receiver counts it as the linear fallback.
    assert stats["linear"] == len(payload), stats
    with Device.open(lab.if_b, lab.ns_b) as dev:
        assert "dmabuf" not in netdev.queue_get(dev, QUEUE)


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
    r = _zcnet("bench", "--lab-device", "netdevsim", "--queue", "1", "--engine", "zcrx,devmem",
               "--mtu", "1500", "--placement", "same", "--duration", "1", "--verify",
               "--json", str(out), timeout=900)
    assert r.returncode == 0, r.stderr
    cells = {c["engine"]: c for c in json.loads(out.read_text())["results"]}
    for engine in ("zcrx", "devmem"):
        cell = cells[engine]
        assert cell["status"] == "ok", cell.get("reason")
        assert "netdevsim forwards the sender's pages" in cell["note"]
        assert cell["verify"]["mismatches"] == 0 and cell["verify"]["checked_bytes"] > 0
    zcrx = cells["zcrx"]
    assert zcrx["zcrx_mode"] == "device" and zcrx["engine_stats"]["zcrx_copy"] == 0
    assert _ours() == []


def test_reproduce_mlx5_zcrx_on_a_netdevsim_queue(ready, tmp_path):
    """The real-NIC form of `zcnet reproduce mlx5-zcrx`: side b receives on its netdevsim port
    (HDS on, flow on QUEUE), side a runs the sending `zcnet server`; no substitutions."""
    from zcnet.bench.remote import NetnsServer
    from zcnet.netns import netns_popen

    lab = ready
    token = tmp_path / "token"
    with NetnsServer(host=lab.addr_a, netns=lab.ns_a) as server:
        token.write_bytes(server.token + b"\n")
        token.chmod(0o600)
        out = tmp_path / "out"
        proc = netns_popen(lab.ns_b, [sys.executable, "-m", "zcnet", "reproduce", "mlx5-zcrx",
                                      "--ifname", lab.if_b, "--remote", str(server.address),
                                      "--token-file", str(token), "--queue", str(QUEUE),
                                      "--duration", "0.5", "--repeat", "1", "--out", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, stderr = proc.communicate(timeout=1200)
    assert proc.returncode == 0, stderr[-2000:]
    doc = json.loads((out / "mlx5-zcrx.json").read_text())
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
    assert all(c["zcrx_mode"] == "device" and "netdevsim forwards the sender's pages" in c["note"]
               for c in zcrx), zcrx
