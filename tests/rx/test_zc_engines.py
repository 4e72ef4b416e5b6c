"""The zero-copy engines behind zcnet.rx.engine's contract, on real loopback TCP."""

from __future__ import annotations

import socket
import threading

import pytest

from zcnet.pattern import PERIOD, TILED, Verifier
from zcnet.rx.engine import EngineOptions
from zcnet.rx.registry import engine_names, make_engine

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


def options(**kw) -> EngineOptions:
    o = EngineOptions()
    o.zc_buf, o.zc_area = 64 << 10, 4 << 20  # type: ignore[attr-defined]
    for k, v in kw.items():
        setattr(o, k, v)  # consumer/ifname/queue: see the report to the lead
    return o


def send_pattern(sock: socket.socket, total: int) -> None:
    mv = memoryview(TILED)
    sent = 0
    with sock:
        while sent < total:
            start = sent % PERIOD
            sent += sock.send(mv[start:start + min(1 << 20, total - sent)])


@pytest.fixture
def conn(no_leaks):
    total = 96 << 20
    with socket.create_server(("127.0.0.1", 0)) as srv:
        cli = socket.create_connection(srv.getsockname())
        c, _ = srv.accept()
    t = threading.Thread(target=send_pattern, args=(cli, total))
    t.start()
    with c:
        yield c, total
    t.join()


def test_zero_copy_engines_are_registered():
    assert {"soft-zc", "zcrx", "devmem"} <= set(engine_names())


@pytest.mark.parametrize("consumer", ["same", "thread"])
def test_soft_zc_verified(conn, consumer):
    c, total = conn
    eng = make_engine("soft-zc", options(consumer=consumer))
    assert eng.unsupported() is None
    v = Verifier()
    st = eng.run(c, v.check)
    assert st.bytes == total and v.checked == total and v.mismatches == 0
    assert st.extra["delivered"] == st.extra["released"] > 0
    assert st.extra["consumer_thread"] == (consumer == "thread")


def test_bad_consumer_is_unsupported():
    assert "unknown consumer" in make_engine("soft-zc", options(consumer="bogus")).unsupported()


@pytest.mark.parametrize("name", ["zcrx", "devmem"])
def test_nic_engines_need_a_queue(name):
    why = make_engine(name, options()).unsupported()
    assert why and "--ifname and --queue" in why


@pytest.mark.root
def test_zcrx_engine_on_veth_reports_the_kernel_reason(no_leaks):
    from zcnet.lab import Lab
    from zcnet.netns import in_netns

    with Lab() as lab, in_netns(lab.ns_a):
        why = make_engine("zcrx", options(ifname=lab.if_a, queue=0)).unsupported()
    assert why and "lacks queue management ops or header-data split" in why
