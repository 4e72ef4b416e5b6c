"""One zcrx queue received by several processes against a real 7.x kernel in copy mode
(booted by `zcnet vm run`): the host registers it in a memfd and hands it to worker
processes (ZCRX_CTRL_EXPORT, the "[zcrx]" file sent over a unix socket), each imports it on a
ring of its own (ZCRX_REG_IMPORT) and serves its connections; one refill ring, written by
every process under one lock. Every byte is checked against its connection's stream."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from zc_helpers import connections, send_from_child, serve_imported
from zcnet.bench.worker import CTX
from zcnet.rx.zc.zcrx_procs import HostedQueue, import_queue
from zcnet.rx.zc.zcrx_queue import ZcrxQueue
from zcnet.rx.zc.zcrx_reg import kernel_offers

pytestmark = pytest.mark.vm

MIB = 1 << 20


@pytest.fixture
def ctx(no_leaks):
    offers = kernel_offers()
    if not (offers.copy_mode and offers.imports):
        pytest.skip("needs zcrx copy mode and ZCRX_REG_IMPORT (7.x); run the vm tests under "
                    "`zcnet vm run`")
    from multiprocessing import forkserver, resource_tracker

    yield CTX
    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


def test_three_processes_receive_one_queue_through_imports(ctx):
    """Three worker processes serve four connections each on the host's queue: every byte
    verified, each worker counts the other processes' connections in its share, every buffer
    it was given goes back through the one refill ring; the host's count follows the workers
    and is 0 once it takes their handoffs back."""
    n, per, total = 12, 4, 512 << 10
    with ExitStack() as stack:
        pairs = connections(stack, n)
        host = HostedQueue(None, None, 16 * MIB)
        stack.callback(host.close)
        hs = [host.handoff() for _ in range(3)]
        assert host.mem.total == 3
        procs = []
        for k, h in enumerate(hs):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=serve_imported,
                            args=(h, [s for s, _ in pairs[k * per:(k + 1) * per]], k * per,
                                  child))
            p.start()
            child.close()
            stack.callback(parent.close)
            procs.append((p, parent))
        for _, parent in procs:
            assert parent.poll(120) and parent.recv() == "joined"
        assert host.mem.total == n
        sender = send_from_child([c for _, c in pairs], total)
        results = []
        for _, parent in procs:
            assert parent.poll(300)
            results.append(parent.recv())
        sender.join(60)
        assert all(isinstance(r, tuple) for r in results), results
        for got, errors, members, share, produced, delivered in results:
            assert got == [total] * per and not errors
            assert members >= per + 2 and share <= 16 * MIB // members
            assert produced == delivered > 0
        for p, _ in procs:
            p.join(30)
            assert p.exitcode == 0
        assert host.mem.total == 0  # each worker's connections left
        for h in hs:
            host.taken_back(h)
        assert host.mem.total == 0 and {1, 2, 3} <= set(host.free)


def test_an_imported_queue_has_what_a_registered_one_has(ctx):
    """import_queue builds a ZcrxQueue without registering: every attribute a registered
    queue has, the same layout, its own ring and zcrx id."""
    with ExitStack() as stack:
        host = HostedQueue(None, None, 4 * MIB)
        stack.callback(host.close)
        h = host.handoff()
        stack.callback(host.taken_back, h)
        mine = import_queue(h, shared=True)
        stack.callback(mine.close)
        assert isinstance(mine, ZcrxQueue) and set(vars(mine)) == set(vars(host.zq))
        assert mine.ring is not host.zq.ring and mine.rq.entries == host.zq.rq.entries
        assert mine.area.size == host.zq.area.size and mine.buf_len == host.zq.buf_len
        assert mine.rq.area_token == host.zq.rq.area_token and mine.copy
