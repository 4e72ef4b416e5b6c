"""Server and client inside a lab: one server per namespace, control and data over the veth."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zcnet.bench.client import ClientOptions, lab_servers, run
from zcnet.bench.records import ResultRow
from zcnet.errors import ZcnetError

pytestmark = [pytest.mark.root, pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]


def test_flows_between_lab_namespaces(no_leaks):
    from zcnet.lab import Lab

    home = os.stat("/proc/thread-self/ns/net").st_ino
    with Lab(mtu=1500) as lab, lab_servers(lab) as ls:
        assert ls.src.startswith(lab.addr_a) and ls.dst.startswith(lab.addr_b)
        seen: dict[str, int] = {}

        def where(placed: list[ResultRow]) -> None:
            # While it runs, the receiving worker lives in ns_b, the sending one in ns_a.
            seen["rx"] = os.stat(f"/proc/{placed[0].rx_pid}/ns/net").st_ino
            seen["tx"] = os.stat(f"/proc/{placed[0].tx_pid}/ns/net").st_ino

        # The non-loopback listeners demand their tokens.
        with pytest.raises(ZcnetError, match="authentication failed"):
            run(ClientOptions(src=ls.src, dst=ls.dst, netns=lab.ns_a, duration=0.2))
        res = run(ls.options(ClientOptions(flows=2, duration=0.5, on_started=where)))
        rr = run(ls.options(ClientOptions(mode="rr", duration=0.3)))
        assert seen["rx"] == Path(f"/run/netns/{lab.ns_b}").stat().st_ino
        assert seen["tx"] == Path(f"/run/netns/{lab.ns_a}").stat().st_ino
        assert [f.status for f in res.flows] == ["ok", "ok"]
        assert all(f.bytes == f.bytes_sent > 0 for f in res.flows)
        assert rr.flows[0].status == "ok" and rr.flows[0].samples > 0
        # Each server reports the NIC its flows arrive on: the lab's veth end in its namespace.
        assert res.hosts["dst"]["nic"]["ifname"] == lab.if_b
        assert res.hosts["src"]["nic"]["ifname"] == lab.if_a
        assert res.hosts["dst"]["nic"]["driver"] == "veth"
    # This thread never left its own namespace.
    assert os.stat("/proc/thread-self/ns/net").st_ino == home
