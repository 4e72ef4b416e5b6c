"""A GC pass while the compiled pass makes a member's Completions runs a Python round on that
member, which replaces its inbox: the completions must go to the inbox as it is after that,
not to the list it replaced (they would be lost, the buffer ring out of step)."""
import asyncio

from common import Bomb, collect_at_next_allocation, pair, restore_collector, verdict

from zcnet import aio
from zcnet.aio import shared
from zcnet.uring.completions import Completions

shared.FEW = 0  # every group as a Completions, the path of a pass of many CQEs
state: dict = {}
armed = [False]
made = Completions.from_raw


def of(raw, n, cqe32):
    if armed[0] and not Bomb.fired:
        collect_at_next_allocation()
        try:
            return made(raw, n, cqe32)
        finally:
            restore_collector()
    return made(raw, n, cqe32)


Completions.from_raw = staticmethod(of)


async def main() -> None:
    c, s = await pair()
    rx = state["rx"] = aio.open_receiver(s, own_socket=True, area_size=256 << 10,
                                         buf_size=4096)
    c.setblocking(True)
    c.sendall(b"a" * 100)
    (await asyncio.wait_for(rx.recv_batch(), 5)).release()
    Bomb(lambda: rx.rx.recv(0), armed)
    armed[0] = True
    c.sendall(b"b" * 100)
    try:
        b = await asyncio.wait_for(rx.recv_batch(), 5)
        got = bytes(b.views()[0])
        b.release()
    except asyncio.TimeoutError:
        got = b""
    armed[0] = False
    if not Bomb.fired:
        print("VERDICT nofire")
        return
    c.sendall(b"c" * 100)
    b = await asyncio.wait_for(rx.recv_batch(), 5)
    verdict(got == b"b" * 100 and bytes(b.views()[0]) == b"c" * 100, f"got {got[:8]!r}")
    b.release()
    rx.close()
    c.close()

asyncio.run(main())
