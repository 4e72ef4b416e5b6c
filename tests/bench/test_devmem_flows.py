"""A server session's devmem flows: the session joins one binding per queue set for them
(zcnet.bench.devmem_flows); its refusals are the replies a worker would have given. The flow
workers' side, end to end, runs in the nsim VM (tests/vm/test_nsim_vm.py, the 8-flow client
test)."""

from __future__ import annotations

import os

import pytest

from zcnet.bench.devmem_flows import join
from zcnet.bench.worker import SessionError
from zcnet.nic.netdev import DmabufBinding

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def fake_bind(monkeypatch):
    from zcnet.nic.genl import GenlSocket
    from zcnet.rx.zc import devmem_binding

    made: list[list[int]] = []

    def bind(ifname: str, fd: int, queues: list[int]) -> DmabufBinding:
        made.append(queues)
        return DmabufBinding(GenlSocket(), 9, 1, queues)

    monkeypatch.setattr(devmem_binding, "bind_rx", bind)
    monkeypatch.setattr(devmem_binding, "_reserve", lambda ifname: 0)
    return made


def test_flows_on_one_queue_set_join_one_binding(fake_bind, memfd_dmabuf):
    opts = {"ifname": "eth7", "queues": "2,1", "zc_area": 4 << 20}
    first = join("devmem", opts, 1 << 20)
    second = join("devmem", opts, 1 << 20)
    assert first is second and fake_bind == [[1, 2]]
    assert first.members == 2 and first.owner
    handle = first.shared()
    assert (handle.queues, handle.binding_id, handle.size) == ((1, 2), 9, 4 << 20)
    first.quit()
    assert not first.closed
    second.quit()
    assert first.closed


@pytest.mark.parametrize(("engine", "opts"), [
    ("soft-zc", {"ifname": "eth7", "queue": 1}), ("devmem", {}), ("devmem", {"ifname": "x"}),
    ("devmem", {"queue": 1})])
def test_other_engines_and_flows_naming_no_queue_join_nothing(fake_bind, engine, opts):
    assert join(engine, opts, 1 << 20) is None and fake_bind == []


def test_a_bad_option_is_invalid_and_a_device_refusal_unsupported(monkeypatch):
    with pytest.raises(SessionError) as ei:
        join("devmem", {"ifname": "eth7", "queues": "1,x"}, 1 << 20)
    assert ei.value.code == "invalid" and "expected queue ids" in str(ei.value)
    from zcnet.errors import Unsupported
    from zcnet.rx.zc import devmem_binding

    monkeypatch.setattr(devmem_binding, "bind_rx",
                        lambda *a: (_ for _ in ()).throw(Unsupported("device eth7 cannot")))
    with pytest.raises(SessionError) as ei:
        join("devmem", {"ifname": "eth7", "queue": 1, "zc_area": 1 << 20}, 1 << 20)
    assert ei.value.code == "unsupported"
    assert str(ei.value) == "engine devmem unsupported here: device eth7 cannot"


@pytest.fixture
def memfd_dmabuf(monkeypatch):
    """udmabuf stand-in: a memfd of the asked size (no device reads it here)."""
    from zcnet.rx.zc import devmem_binding

    def make(size: int) -> int:
        fd = os.memfd_create("zcnet-test-dmabuf", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd

    monkeypatch.setattr(devmem_binding, "udmabuf_create", make)
    monkeypatch.setattr(devmem_binding, "UDMABUF_DEV", "/dev/null")  # no probe: "it exists"
