"""zcnet inside the asyncio event loop: zero-copy receive and async send, no helper thread.

    async with zcnet.aio.open_receiver(sock, "soft") as rx:
        async for chunk in rx:              # or: batch = await rx.recv_batch()
            consume(chunk.data)             # a view into the registered area
            chunk.release()

    async with zcnet.aio.open_sender(sock, "sendzc") as tx:
        slot = await tx.acquire()           # back-pressure: waits for a free slot
        slot.view[:n] = ...
        done = await tx.send(slot, n)       # the kernel took the bytes
        copied = await done                 # the kernel released the slot

    zcnet.aio.start_protocol(sock, MyProtocol())  # callbacks: chunk_received(chunk), no Task

    async with zcnet.aio.keep_ring():       # a server: the loop's ring and spare areas stay
        await server.serve_forever()        # between connections (zcnet.aio.keep)

Design decisions, and why:

- **Waking the loop: an eventfd registered with the ring (IORING_REGISTER_EVENTFD), not the ring
  fd.** zcrx rings use DEFER_TASKRUN (required), and so do the loop's soft ring and the
  async sender's where the kernel allows (completions posted on our CPU inside our own enter).
  Arriving data then queues task work instead of a CQE, and queueing task work does not wake
  the ring fd's poll queue: epoll, under asyncio and uvloop, never hears of it (measured here:
  ``select`` on the ring fd says readable, an epoll set holding it stays empty). The kernel
  does signal a registered eventfd when task work is queued on an empty list. Details and the
  no-lost-wake-up rule: :mod:`zcnet.aio.wakeup`.
- **The task-run mode is measured, not assumed** (:mod:`zcnet.aio.taskrun`): where that
  eventfd signal comes an RCU grace period late (16 ms on 6.18.44 here, every idle round trip
  16 ms), the loop's own rings use COOP_TASKRUN instead; a probe at the first ring decides.
- **Polling is a plain GETEVENTS enter**, not ``Receiver.recv(timeout=0)``: a zero timeout
  makes the kernel arm a timer and often switch context, 10-20x the cost of the enter.
- **One io_uring per loop for soft receivers** (:mod:`zcnet.aio.shared`): one eventfd, one
  reader callback and one enter per pass for every connection, completions dispatched by
  user_data, arms submitted together once per loop iteration, and no enter that finds
  nothing (IORING_SETUP_TASKRUN_FLAG). zcrx receivers share their NIC queue's ring, one
  per queue per loop thread (:mod:`zcnet.aio.loop_zcrx`); devmem keeps a ring of its own
  (:mod:`zcnet.aio.wakeup`). The ring lives from the first receiver to the last, or as long
  as :func:`keep_ring` holds it: an explicit holder, since asyncio tells a library nothing
  when a loop closes (:mod:`zcnet.aio.keep`).
- **Cancelling loses nothing**: what the kernel delivered waits in the receiver (completions
  dispatched to it, chunks reaped but not yet handed out by ``async for``), never in the
  task; a task sleeps only when nothing is there for it.
- **Release semantics are those of zcnet.rx.zc**: any task or thread may release; the loop
  returns buffers to the kernel in batches. While delivery is paused (``max_held``, or no
  buffers left) the receiver sleeps until a release calls it back (``Receiver.on_release``).
- **The sender's eventfd callback does the reaping**: SEND_ZC notifications must free slots
  even when no task is sending, so ``acquire`` and the futures ``send`` returns resolve from
  the loop itself. One send is in flight at a time (stream order); any number of
  notifications.
- **One owner**: an object belongs to the loop (and thread) that opened it; use from another
  loop or thread raises ZcnetError; only releasing chunks is allowed from anywhere.
- **Loop shutdown**: ``asyncio.run``/``uvloop.run``/``asyncio.Runner`` cancel all tasks before
  closing; a guard task per loop (:mod:`zcnet.aio.loop`) then closes what was left open with a
  ResourceWarning. Held chunks stay valid until released; the area goes with the last one.
- **Existing servers**: :func:`adopt_transport` (in ``Protocol.connection_made``) and
  :func:`adopt_stream` (in a ``start_server`` handler) take the connection from the transport.

Loops: the default asyncio loop and uvloop (the loop itself), anyio on either of its backends,
and trio >= 0.22 (a trio run gets :class:`zcnet.aio.backend.TrioLoop`, the same slice of loop
calls built on trio's lowlevel API); all tested. The receive/send logic is the same code on all
of them.
"""

from zcnet.aio.keep import RingKeeper, keep_ring
from zcnet.aio.protocol import ZcProtocol, ZcTransport, start_protocol
from zcnet.aio.receiver import AsyncReceiver, open_receiver
from zcnet.aio.sender import AsyncSender, Slot, open_sender
from zcnet.aio.sockets import adopt_stream, adopt_transport, check_tcp_socket

__all__ = ["AsyncReceiver", "AsyncSender", "RingKeeper", "Slot", "ZcProtocol", "ZcTransport",
           "adopt_stream", "adopt_transport", "check_tcp_socket", "keep_ring", "open_receiver",
           "open_sender", "start_protocol"]
