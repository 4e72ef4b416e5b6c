"""zcnet.aio under anyio: on its asyncio backend (the default loop and uvloop), where zcnet.aio
runs unchanged, and on its trio backend (zcnet.aio.backend's TrioLoop); plain trio.run too.

Real loopback streams through open_receiver and open_sender, every byte checked; anyio's
cancel scopes while a task awaits a chunk."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from aio_util import pattern
from anyio_util import RUNNERS, receive_checked, sendall, tcp_pair
from zcnet import aio

pytestmark = pytest.mark.parametrize("runner", list(RUNNERS))

SMALL = {"area_size": 256 << 10, "buf_size": 16 << 10}


@pytest.mark.parametrize("kind", ["sendzc", "copy"])
def test_stream_through_receiver_and_sender_every_byte(runner, kind, no_leaks):
    """One zcnet sender to one zcnet receiver in a task group; the receiver checks every byte
    by stream offset, every send's completion resolves, nothing is left in flight."""
    size, slot = 3 << 20, 128 << 10
    data = pattern(3, size)

    async def main() -> tuple[list, dict, dict]:
        [(c, s)] = tcp_pair()
        out: dict = {}

        async def receive() -> None:
            async with aio.open_receiver(s, own_socket=True) as rx:
                out["check"] = await receive_checked(rx, data)
                out["rx"] = rx.stats_dict()

        done = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            async with aio.open_sender(c, kind, slots=4, slot_size=slot, own_socket=True) as tx:
                for off in range(0, size, slot):
                    sl = await tx.acquire()
                    sl.view[:] = data[off:off + slot]
                    done.append(await tx.send(sl, slot))
                copied = [await d for d in done]
                await tx.flush()
                tx_stats = tx.stats().as_dict()
        assert out["check"].complete
        return copied, tx_stats, out["rx"]

    copied, tx_stats, rx_stats = RUNNERS[runner](main)
    assert len(copied) == size // slot and all(isinstance(x, bool) for x in copied)
    assert tx_stats["bytes"] == size and tx_stats["pending"] == 0
    assert rx_stats["delivered_bytes"] == size and rx_stats["in_flight"] == 0


@pytest.mark.parametrize("shared_ring", [True, False])
def test_cancel_scope_while_awaiting_a_chunk_loses_nothing(runner, shared_ring, no_leaks):
    """A task parked in ``anext(rx)`` is cancelled through its CancelScope, and a receive under
    move_on_after times out (nothing was sent yet); the data sent afterwards all arrives,
    every buffer comes back, nothing leaks."""
    size = 1 << 20
    data = pattern(4, size)

    async def main() -> tuple[bool, bool, dict]:
        [(c, s)] = tcp_pair()
        async with aio.open_receiver(s, own_socket=True, shared_ring=shared_ring,
                                     **SMALL) as rx:
            got: list = []

            async def park() -> None:
                got.append(await anext(aiter(rx)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(park)
                await anyio.wait_all_tasks_blocked()  # parked on the receiver's wait
                tg.cancel_scope.cancel()
            assert got == [] and tg.cancel_scope.cancel_called
            with anyio.move_on_after(0.05) as scope:
                got.append(await rx.recv())
            timed_out = scope.cancelled_caught
            async with anyio.create_task_group() as tg:
                tg.start_soon(sendall, c, data)
                check = await receive_checked(rx, data)
            return timed_out, check.complete, rx.stats_dict()

    timed_out, complete, st = RUNNERS[runner](main)
    assert timed_out and complete
    assert st["delivered_bytes"] == size
    assert st["in_flight"] == 0 and st["delivered"] == st["released"]


def test_timeouts_beside_other_tasks(runner, no_leaks):
    """fail_after around each receive of a slow stream: the sender, another task of the same
    run, sleeps between pieces, so it advances only while the receiver waits on the loop (not
    in the kernel: were it to block there, the run would hang); nothing times out and the
    stream arrives intact."""
    pieces, piece = 8, 64 << 10
    data = pattern(8, pieces * piece)

    async def main() -> bool:
        [(c, s)] = tcp_pair()

        async def slow_sender() -> None:
            for i in range(pieces):
                await sendall(c, data[i * piece:(i + 1) * piece], close=False)
                await anyio.sleep(0.01)
            c.close()

        got = np.empty(0, np.uint8)
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow_sender)
            async with aio.open_receiver(s, own_socket=True, **SMALL) as rx:
                while True:
                    with anyio.fail_after(30):
                        chunks = await rx.recv()
                    if not chunks:
                        break
                    for ch in chunks:
                        got = np.concatenate([got, np.frombuffer(ch.data, np.uint8)])
                        ch.release()
        return bool(np.array_equal(got, data))

    assert RUNNERS[runner](main)
