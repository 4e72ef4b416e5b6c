"""Bench experiments on a named NIC: the receiving side here, the sender a remote zcnet server.

The lab stands in for two hosts: the "remote" server runs in ns_a, the experiment runs inside
ns_b with --ifname naming ns_b's veth, so every step of the real-NIC path runs for real.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from server_util import server
from zcnet.bench.control import Control

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.mark.root
def test_bench_experiment_on_a_named_nic_runs_through_the_remote_server(no_leaks,
                                                                       tmp_path: Path) -> None:
    from zcnet.bench.remote import NetnsServer
    from zcnet.lab import Lab

    with Lab(mtu=1500) as lab, NetnsServer(lab.addr_a, netns=lab.ns_a) as sender:
        token = tmp_path / "token"
        token.write_bytes(sender.token)
        token.chmod(0o600)   # token files others can read are refused
        out = tmp_path / "nic.json"
        assert sender.address is not None
        r = subprocess.run(
            ["ip", "netns", "exec", lab.ns_b, sys.executable, "-m", "zcnet", "reproduce",
             "mlx5-zcrx", "--ifname", lab.if_b, "--remote", sender.address, "--token-file",
             str(token), "--queue", "0", "--data-port", "20000", "--duration", "0.4",
             "--json", str(out)],
            capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["env"]["lab"] is False and doc["env"]["remote"] == sender.address
    cells = {(c["mtu"], c["engine"]): c for c in doc["results"]}
    for engine in ("epoll", "uring"):  # the interface's own MTU: measured through the client
        c = cells[(1500, engine)]
        assert c["status"] == "ok" and c["via"] == "server" and c["bytes"] > 0, c
    # No substitution with --ifname: zcrx itself, refused by this kernel for a veth queue.
    assert cells[(1500, "zcrx")]["status"] == "unsupported"
    assert "queue management ops" in cells[(1500, "zcrx")]["reason"]
    # Rows the interface's MTU cannot carry say how to set it; peers stay in the lab.
    assert "ip link set dev IF mtu 9000" in cells[(9000, "epoll")]["reason"]
    assert "lab only" in cells[(1500, "iperf3")]["reason"]
    assert not any("substitut" in s.get("text", "") and "zcrx" in s.get("text", "")
                   for s in doc.get("experiment", {}).get("substitutions", []))


def test_open_listens_on_the_requested_data_port(tmp_path: Path) -> None:
    """The port a `zcnet nic setup --port` rule steers is the one the receiving flow uses."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with server(tmp_path, "127.0.0.1") as s:
        ctl = Control(s.address, None)
        try:
            opened = ctl.request({"type": "open", "flow": 0, "mode": "stream", "engine": "epoll",
                                  "read_size": 4096, "req_size": 1, "resp_size": 1,
                                  "port": port})
            assert opened["port"] == port
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        finally:
            ctl.close()
