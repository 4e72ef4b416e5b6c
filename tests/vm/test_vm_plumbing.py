"""The VM test plumbing itself: these run inside the VM (marker ``vm``) under a kernel >= 7.2."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from leaks import Snapshot
from zcnet.uring.prep import prep_nop
from zcnet.uring.ring import Ring
from zcnet.vm.kernels import MIN_VERSION, version_tuple
from zcnet.vm.runner import HOST_RELEASE_ENV, IN_VM_ENV

pytestmark = pytest.mark.vm


def test_runs_in_vm_under_a_newer_kernel() -> None:
    assert os.environ.get(IN_VM_ENV) == "1"
    release = os.uname().release
    assert version_tuple(release) >= MIN_VERSION, release
    assert release != os.environ[HOST_RELEASE_ENV]
    assert os.geteuid() == 0


def test_io_uring_nop_round_trip(no_leaks) -> None:
    with Ring(8) as ring:
        for ud in (1, 2, 3):
            prep_nop(ring, ud)
        assert ring.submit(3) == 3
        done = ring.reap()
        assert sorted(done.user_data.tolist()) == [1, 2, 3]
        assert done.res.tolist() == [0, 0, 0]


def test_lab_netns_veth_carries_tcp(no_leaks) -> None:
    # zcnet.lab (pyroute2) is imported by the tests that use it: at collection it would cost
    # seconds under TCG before the first vm test runs.
    from zcnet.lab import Lab
    from zcnet.netns import in_netns

    payload = os.urandom(1 << 20)
    with Lab() as lab:
        with in_netns(lab.ns_b):
            listener = socket.create_server((lab.addr_b, 0))
        port = listener.getsockname()[1]
        got = bytearray()

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                while chunk := conn.recv(65536):
                    got.extend(chunk)

        server = threading.Thread(target=serve)
        server.start()
        try:
            with in_netns(lab.ns_a):
                client = socket.create_connection((lab.addr_b, port), timeout=60)
            with client:
                client.sendall(payload)
        finally:
            server.join(60)
            listener.close()
    assert bytes(got) == payload


def test_no_leaks_sees_a_leak_inside(no_leaks) -> None:
    """The leak checker works in the guest: a lab made here shows up until it is taken down."""
    from zcnet.lab import Lab

    before = Snapshot.take()
    lab = Lab().up()
    try:
        leaked = " ".join(Snapshot.take().leaked_since(before))
        assert lab.ns_a in leaked and lab.ns_b in leaked
    finally:
        lab.down()
    assert Snapshot.take().leaked_since(before) == []
