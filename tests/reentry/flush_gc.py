"""A GC pass inside the compiled flush (its first allocation, the queue's iterator) whose
finalizer releases a held batch, flushes in Python and releases another: the flush must write
the buffer ring from the state after that, or buffers and counts are lost for good."""
import asyncio

from common import Bomb, collect_at_next_allocation, pair, restore_collector, verdict

from zcnet import aio

state: dict = {}
armed = [False]


def inside_flush() -> None:
    state.pop("h1").release()
    state["rx"].rx.flush()
    state.pop("h2").release()


async def batch(rx, c, n):
    c.setblocking(True)
    c.sendall(b"x" * n)
    c.setblocking(False)
    await asyncio.sleep(0.02)
    return await rx.recv_batch()


async def main() -> None:
    c, s = await pair()
    rx = state["rx"] = aio.open_receiver(s, own_socket=True, area_size=256 << 10,
                                         buf_size=4096)
    b1 = await batch(rx, c, 3 * 4096)
    state["h1"] = await batch(rx, c, 3 * 4096)
    state["h2"] = await batch(rx, c, 3 * 4096)
    b1.release()
    del b1
    Bomb(inside_flush, armed)
    collect_at_next_allocation()
    armed[0] = True
    rx._take_batch()
    armed[0] = False
    restore_collector()
    if not Bomb.fired:
        print("VERDICT nofire")
        return
    rx.rx.flush()
    b, st = rx.rx.provider.group.buf, rx.stats_dict()
    verdict((b.tail - b.head) & 0xFFFF == b.in_ring == b.entries
            and st["delivered"] == st["released"] and st["in_flight"] == 0,
            f"in_ring {b.in_ring} of {b.entries}, {st}")
    rx.close()
    c.close()

asyncio.run(main())
