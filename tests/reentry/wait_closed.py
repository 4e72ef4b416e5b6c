"""A receive finds nothing and waits; a GC pass while its future is made closes the receiver,
whose wake-up finds no waiter yet. The receive must raise ClosedError, not wait forever.
SLACK (argv[1]) places the pass: 0 lands in the compiled step's create_future, 4 or 5 in the
Python one's."""
import asyncio
import sys

from common import Bomb, collect_at_next_allocation, pair, restore_collector, verdict

from zcnet import aio
from zcnet.errors import ClosedError

armed = [False]


async def main() -> None:
    c, s = await pair()
    rx = aio.open_receiver(s, own_socket=True, area_size=256 << 10, buf_size=4096)
    c.send(b"a" * 100)
    (await asyncio.wait_for(anext(rx), 5)).release()
    await asyncio.sleep(0.01)
    rx.flush()  # nothing queued: the step's take() allocates nothing and finds nothing
    step = rx.__anext__()
    me = asyncio.current_task()
    timed_out: list[bool] = []
    early: list[bool] = []  # the pass ran before the timeout: inside the receive

    def time_out() -> None:
        timed_out.append(True)
        me.cancel()

    timer = asyncio.get_running_loop().call_later(3, time_out)  # made before the pass is set
    Bomb(lambda: (early.append(not timed_out), rx.close()), armed)
    collect_at_next_allocation(int(sys.argv[1]))
    armed[0] = True
    try:
        await step  # not through wait_for: its task would take the pass first
        outcome = "a chunk"
    except ClosedError:
        outcome = "closed"
    except asyncio.CancelledError:
        outcome = "waited"
    finally:
        armed[0] = False
        restore_collector()
        timer.cancel()
    if not early or not early[0]:
        print("VERDICT nofire")
    else:
        verdict(outcome == "closed", outcome)
    rx.close()
    c.close()

asyncio.run(main())
