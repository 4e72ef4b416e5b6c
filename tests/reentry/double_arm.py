"""A released batch's finalizer, run when the compiled round's flush drops it, runs a Python
round that re-arms the receive that had ended. The compiled round must see that and not arm a
second multishot receive on the same socket and buffer group."""
import asyncio

import numpy as np
from common import pair, verdict

from zcnet import aio
from zcnet.rx.zc.core import Phase

N = 2 << 20
DATA = ((np.arange(N, dtype=np.uint32) * 7) % 251).astype(np.uint8).tobytes()
state: dict = {"twice": 0}


class Restart:
    def __del__(self) -> None:
        state["rx"].rx.recv(0)


async def main() -> None:
    loop = asyncio.get_running_loop()
    c, s = await pair()
    c.setblocking(True)
    send = loop.run_in_executor(None, lambda: (c.sendall(DATA), c.close()))
    await asyncio.sleep(0.05)
    rx = state["rx"] = aio.open_receiver(s, own_socket=True, area_size=64 << 10,
                                         buf_size=4096)
    prov = rx.rx.provider
    arm = prov.arm

    def counting_arm() -> None:
        state["twice"] += rx.rx.core.armed
        arm()

    prov.arm = counting_arm
    out = bytearray()
    while rx.rx.core.phase in (Phase.IDLE, Phase.ARMED):  # until a receive ended with data
        b = await asyncio.wait_for(rx.recv_batch(), 10)
        for v in b.views():
            out += v
        b.release()
    b._offsets = Restart()  # the released batch, still queued (a slot it is dropped with)
    del b
    rx._take_batch()
    while (b := await asyncio.wait_for(rx.recv_batch(), 10)) is not None:
        for v in b.views():
            out += v
        b.release()
    await send
    verdict(state["twice"] == 0 and bytes(out) == DATA,
            f"{state['twice']} arms of an armed receive, {len(out)} of {N} bytes")
    rx.close()

asyncio.run(main())
