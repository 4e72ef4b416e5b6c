"""Helpers for the re-entry cases: each case is a script run in its own interpreter (it changes
the collector's thresholds and patches classes) that ends by printing one verdict line:
``VERDICT ok``, ``VERDICT bad <what>``, or ``VERDICT nofire`` when the collector did not run
where the case needed it (the test then skips)."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Callable
from typing import Any


async def pair() -> tuple[socket.socket, socket.socket]:
    loop = asyncio.get_running_loop()
    ls = socket.create_server(("127.0.0.1", 0))
    ls.setblocking(False)
    c = socket.socket()
    c.setblocking(False)
    await loop.sock_connect(c, ls.getsockname())
    s, _ = await loop.sock_accept(ls)
    ls.close()
    return c, s


#: Kept alive until restore_collector: freeing them would take the count back down.
_PAD: list[list[int]] = []


def collect_at_next_allocation(slack: int = 0) -> None:
    """Make the collector run at the ``slack``-th next tracked allocation."""
    gc.collect()
    gc.set_threshold(1000, 1000, 1000)
    while gc.get_count()[0] < 1000 - slack:
        _PAD.append([])


def restore_collector() -> None:
    gc.set_threshold(700, 10, 10)
    _PAD.clear()


class Bomb:
    """In a cycle: its finalizer runs in the next GC pass and calls ``action`` once, while
    ``armed[0]`` is set; unarmed passes leave a new Bomb behind."""

    fired = False

    def __init__(self, action: Callable[[], Any], armed: list[bool]) -> None:
        self.me = self
        self.action = action
        self.armed = armed

    def __del__(self) -> None:
        if Bomb.fired:
            return
        if self.armed[0]:
            Bomb.fired = True
            self.action()
        else:
            Bomb(self.action, self.armed)


def verdict(ok: bool, what: str = "") -> None:
    print("VERDICT " + ("ok" if ok else f"bad {what}"))
