"""Holding the loop's shared ring open between connections: :func:`keep_ring`.

The loop's shared ring (:mod:`zcnet.aio.shared`) opens with its first soft receiver and closes
with its last, and the areas of closed receivers it keeps for the next ones go with it. A
server that mostly has no connection open (one client at a time, short connections) then pays,
per connection, for a new ring (~0.3 ms here) and a newly populated area (~1.5 ms for the
default 4 MiB), where a uvloop Protocol server spends ~0.1 ms in all (benchmarks/aio_churn.py).

The ring is not kept past its last receiver by default because asyncio says nothing to a
library when a loop closes: a loop closed by hand without cancelling its tasks would leak a
ring kept that way. A holder makes the lifetime explicit instead: the ring and its spare areas
stay while it is open, are freed when it closes, and a holder still open when the loop shuts
down is closed there with a ResourceWarning, as a forgotten receiver is.
"""

from __future__ import annotations

import contextlib

from zcnet.aio.loop import LoopResource, Owner, ResourceState, track, untrack
from zcnet.aio.shared import LoopRing, loop_ring


class RingKeeper(LoopResource):
    """Keeps the running loop's shared ring, and the areas it keeps for new receivers, open
    until :meth:`close` (or the end of ``async with``)."""

    def __init__(self) -> None:
        self._owner = Owner("zcnet.aio.keep_ring")
        self._lr: LoopRing = loop_ring(self._owner.loop)
        self._lr.keepers += 1
        self._state = ResourceState()
        with contextlib.ExitStack() as undo:  # a trio run that is ending: let go at once
            undo.callback(self._lr.unkeep)
            undo.callback(setattr, self._state, "closed", True)
            track(self._owner.loop, self)
            undo.pop_all()

    def _free(self) -> None:
        """Let go of the ring: it closes now if no receiver is open on it, else with the last."""
        self._state.closed = True
        untrack(self._owner.loop, self)
        self._lr.unkeep()

    def __repr__(self) -> str:
        return f"<zcnet.aio ring keeper {'closed' if self._state.closed else 'open'}>"


def keep_ring() -> RingKeeper:
    """Hold the running loop's shared ring open (opening it now if needed) until the holder
    closes, so connections opened and closed meanwhile reuse the ring and the areas it keeps::

        async with zcnet.aio.keep_ring():
            server = await asyncio.start_server(handle, host, port)
            await server.serve_forever()
    """
    return RingKeeper()
