"""Public zero-copy receive API: a Receiver over a connected TCP socket yields Chunks.

    from zcnet.rx.zc import open_receiver

    with open_receiver(sock, provider="auto") as rx:
        for chunk in rx:                  # chunk.data: memoryview, chunk.array: numpy, no copy
            consume(chunk.data)
            chunk.release()               # or `with chunk:`, or rx.release_many(chunks)

A chunk is a view into the registered area. Until it is released the kernel will not write
there; after release the memory may be reused at once. Release from any thread: releases from
other threads are queued and the thread that opened the receiver (the ring's owner) gives them
back in batches. Everything else (iteration, recv, close) belongs to the owner thread.

``recv_batch`` is the low-overhead form: everything one kernel round delivered, as arrays of
offsets and lengths, released with one call; no Python object per buffer.

This module is the public surface; the parts live in chunks.py (Chunk, Batch), receiver.py
(Receiver) and opener.py (open_receiver and the provider choice).
"""

from __future__ import annotations

from zcnet.rx.zc.bookkeeping import Stats
from zcnet.rx.zc.chunks import Batch, Chunk, CoalescedChunk, LinearChunk
from zcnet.rx.zc.debugviews import POISON
from zcnet.rx.zc.opener import open_receiver
from zcnet.rx.zc.providers import PROVIDERS
from zcnet.rx.zc.receiver import Receiver

__all__ = ["POISON", "PROVIDERS", "Batch", "Chunk", "CoalescedChunk", "LinearChunk", "Receiver",
           "Stats", "open_receiver"]
