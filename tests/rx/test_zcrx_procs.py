"""zcrx across processes (zcnet.rx.zc.zcrx_procs) on the host's kernel: the lock between the
refill ring's writers, the count page, the handoff's fds crossing to a child, and the clear
refusals where the kernel has no ZCRX_REG_IMPORT (6.18 here). Receiving through an imported
queue runs in the copy-mode VM (test_zcrx_procs_vm.py) and on netdevsim (tests/vm)."""

from __future__ import annotations

import contextlib
import mmap
import os
import select

import pytest

from zcnet.bench import zcrx_flows
from zcnet.bench.worker import CTX, SessionError
from zcnet.errors import UsageError
from zcnet.rx.engine import EngineOptions
from zcnet.rx.zc.area import PAGE_SIZE
from zcnet.rx.zc.engines import ZcrxEngine
from zcnet.rx.zc.zcrx_procs import HostedQueue, ProcessLock, SharedIfqMemory, ZcrxHandoff
from zcnet.rx.zc.zcrx_reg import kernel_offers

no_import = pytest.mark.skipif(kernel_offers().imports,
                               reason="this kernel has ZCRX_REG_IMPORT (the VM tests cover it)")


@pytest.fixture
def ctx(no_leaks):
    """The bench's worker context; its fork server (and resource tracker) stopped after the
    test, before the leak check."""
    from multiprocessing import forkserver, resource_tracker

    yield CTX
    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


def _handoff(box: int, memfd: int) -> ZcrxHandoff:
    return ZcrxHandoff(box, memfd, 4096, 4096, 64, 0, 4096, 0, "eth0", 3, None, 5)


def _lock_in_child(h: ZcrxHandoff) -> None:
    lock = ProcessLock(h.memfd)  # the handoff carries the memfd and, as its box, a pipe
    with lock:
        os.write(h.box_fd, b"got")
    lock.close()
    h.close()


def test_the_refill_lock_excludes_another_process(ctx):
    """A child asking for the lock gets it only after this process lets go."""
    memfd = os.memfd_create("t", os.MFD_CLOEXEC)
    r, w = os.pipe()
    with contextlib.ExitStack() as stack:
        for fd in (memfd, r, w):
            stack.callback(os.close, fd)
        lock = ProcessLock(memfd)
        stack.callback(lock.close)
        with lock:
            p = ctx.Process(target=_lock_in_child, args=(_handoff(w, memfd),))
            p.start()
            assert select.select([r], [], [], 1.0)[0] == []  # blocked while we hold it
        assert select.select([r], [], [], 30)[0] == [r]
        assert os.read(r, 3) == b"got"
        p.join(10)
        assert p.exitcode == 0


def test_the_count_page_counts_every_process_and_forgets_a_dead_one():
    """Two processes' slots: the host counts one connection per handoff, each process writes
    its own count; taking a slot back (its process died holding two) takes its count off."""
    memfd = os.memfd_create("t", os.MFD_CLOEXEC)
    os.ftruncate(memfd, PAGE_SIZE)
    page = mmap.mmap(memfd, PAGE_SIZE)
    lock = ProcessLock(memfd)
    host = SharedIfqMemory(None, None, page, lock)  # type: ignore[arg-type]
    one = SharedIfqMemory(None, None, page, lock, slot=1)  # type: ignore[arg-type]
    two = SharedIfqMemory(None, None, page, lock, slot=2)  # type: ignore[arg-type]
    try:
        host.hand_out(1)
        host.hand_out(2)
        assert (one.members, two.members) == (1, 1)  # each: the other's, not yet its own
        with lock:
            one.count(1)
            one.count(1)
        assert (one.members, two.members) == (3, 2)  # two: its handed-out one not yet
        with lock:
            two.count(1)
        assert (one.members, two.members) == (3, 3)
        host.take_back(1)  # process one killed with two connections
        assert two.members == 1 and host.members == 0
    finally:
        lock.close()
        page.close()
        os.close(memfd)


def _report_inodes(h: ZcrxHandoff, conn) -> None:
    conn.send((os.fstat(h.box_fd).st_ino, os.fstat(h.memfd).st_ino, h.slot, h.where))
    h.close()


def test_a_handoff_sends_its_fds_to_a_child(ctx):
    """Pickled to a worker, a handoff carries copies of its two fds (the same files)."""
    box_r, box_w = os.pipe()
    memfd = os.memfd_create("t", os.MFD_CLOEXEC)
    h = _handoff(box_r, memfd)
    want = (os.fstat(box_r).st_ino, os.fstat(memfd).st_ino, 5, "eth0 queue 3")
    parent, child = ctx.Pipe()
    try:
        p = ctx.Process(target=_report_inodes, args=(h, child))
        p.start()
        got = parent.recv()
        p.join(10)
    finally:
        h.close()
        os.close(box_w)
        parent.close()
        child.close()
    assert got == want
    assert p.exitcode == 0


@no_import
def test_hosting_a_queue_needs_import_and_names_the_kernel(no_leaks):
    with pytest.raises(UsageError) as ei:
        HostedQueue("lo", 0, 1 << 20)
    assert "ZCRX_REG_IMPORT (Linux 6.19+)" in ei.value.message
    assert ei.value.hint == "receive every connection of the queue in one process"


@no_import
def test_a_session_without_import_leaves_one_queue_to_the_worker_and_refuses_a_set():
    assert zcrx_flows.join("zcrx", {"ifname": "lo", "queue": 0}, 1 << 16) is None
    assert zcrx_flows.join("zcrx", {}, 1 << 16) is None            # copy mode: no host
    assert zcrx_flows.join("devmem", {"ifname": "lo", "queues": "1,2"}, 1 << 16) is None
    with pytest.raises(SessionError) as ei:
        zcrx_flows.join("zcrx", {"ifname": "lo", "queues": "1,2"}, 1 << 16)
    assert ei.value.code == "unsupported"
    assert "zcrx over queues 1,2 needs ZCRX_REG_IMPORT (Linux 6.19+); name one queue" in str(
        ei.value)


def test_the_engine_outside_a_session_refuses_a_queue_set():
    e = ZcrxEngine(EngineOptions.from_mapping({"ifname": "lo", "queues": "1,2"}))
    try:
        why = e.unsupported()
    finally:
        e.close()
    assert why == ("zcrx registers one queue at a time: queues=1,2 works under `zcnet server` "
                   "(the session hosts a zcrx per queue for its flows, Linux 6.19+); name one "
                   "queue here")
