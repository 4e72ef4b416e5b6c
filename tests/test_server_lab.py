"""Server and client inside a lab: one server per namespace, control and data over the veth."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zcnet.bench.client import ClientOptions, run
from zcnet.bench.remote import NetnsServer
from zcnet.errors import ZcnetError

pytestmark = [pytest.mark.root, pytest.mark.timeout(120)]


def test_flows_between_lab_namespaces(no_leaks):
    from zcnet.lab import Lab
    from zcnet.lab.netns import in_netns

    with Lab(mtu=1500) as lab, NetnsServer(lab.addr_a, netns=lab.ns_a) as a, \
            NetnsServer(lab.addr_b, netns=lab.ns_b) as b:
        assert a.address.startswith(lab.addr_a) and b.address.startswith(lab.addr_b)
        seen: dict[str, int] = {}

        def where(placed: list[dict]) -> None:
            # While it runs, the receiving worker lives in ns_b, the sending one in ns_a.
            seen["rx"] = os.stat(f"/proc/{placed[0]['rx_pid']}/ns/net").st_ino
            seen["tx"] = os.stat(f"/proc/{placed[0]['tx_pid']}/ns/net").st_ino

        tokens = {lab.addr_a: a.token, lab.addr_b: b.token}
        with in_netns(lab.ns_a):
            # The non-loopback listeners demand their tokens.
            with pytest.raises(ZcnetError, match="authentication failed"):
                run(ClientOptions(src=a.address, dst=b.address, duration=0.2))
            res = run(ClientOptions(src=a.address, dst=b.address, flows=2, duration=0.5,
                                    tokens=tokens, on_started=where))
            rr = run(ClientOptions(src=a.address, dst=b.address, mode="rr", duration=0.3,
                                   tokens=tokens))
        assert seen["rx"] == Path(f"/run/netns/{lab.ns_b}").stat().st_ino
        assert seen["tx"] == Path(f"/run/netns/{lab.ns_a}").stat().st_ino
        assert [f["status"] for f in res.flows] == ["ok", "ok"]
        assert all(f["bytes"] == f["bytes_sent"] > 0 for f in res.flows)
        assert rr.flows[0]["status"] == "ok" and rr.flows[0]["samples"] > 0
