"""What a Receiver hands out: Chunks (one buffer or a run of neighbours) and Batches (one
kernel round), each held until released. A chunk is a view into the registered area; releasing
it queues its token for the owner thread to give back to the kernel (see receiver.py).

The public fields (``offset``, ``length``, ``stream_offset``, ``parts``, a batch's ``offsets``
and ``lengths``) are read-only: they describe memory the kernel filled, the receiver's
accounting and the compiled paths (zcnet.rx.zc._rxaccel, zcnet.aio._loopaccel) read them when a
chunk comes back, and an object put there could run Python in the middle of that (an
``__index__`` that closes the receiver). Each is a read-only view of a private slot; with the
accelerator built it reads the slot in place, as fast as the slot itself.
"""

from __future__ import annotations

import operator
import weakref
from collections import deque
from typing import Protocol, TypeVar

import numpy as np

from zcnet.rx.zc.accel import rx_accel_for
from zcnet.rx.zc.bookkeeping import contiguous_runs
from zcnet.rx.zc.provider import Delivery, IntSeq
from zcnet.uring.syscall import slot_members


class ChunkOwner(Protocol):
    """The receive core chunks belong to (zcnet.rx.zc.core.RxCore): its fields and the calls
    a chunk makes when it is read or released."""

    debug: bool
    view: memoryview
    queue: deque[Held]
    waiting: bool
    closed: bool

    def track(self, held: Held, view: object) -> None: ...

    def revoke(self, held: Held) -> None: ...

    def signal(self) -> None: ...

    def late_release(self) -> None: ...


def as_list(seq: IntSeq) -> list[int]:
    """A provider's offsets/lengths/tokens as a list of ints (providers that vectorize give
    numpy arrays; the per-chunk paths need Python ints anyway)."""
    return seq.tolist() if type(seq) is np.ndarray else seq  # type: ignore[return-value]


H = TypeVar("H", bound="Held")


class Held:
    """Something the application holds until it releases it: a Chunk or a Batch.

    ``_rx`` is the owning receive core while held and None once released; only the holder
    writes it, so checking it needs no lock. ``_tok`` is the provider's token (int) or tokens
    (a list or an array). The compiled paths fill and read these slots in place, handed them
    once as ``CHUNK_SLOTS`` and ``BATCH_SLOTS`` (below).
    """

    __slots__ = ("_length", "_rx", "_stream_offset", "_tok")
    _rx: ChunkOwner | None
    _tok: int | IntSeq
    _length: int
    _stream_offset: int
    length: int  #: bytes held (read-only)
    stream_offset: int  #: where they start in the TCP byte stream (read-only)

    def _owner(self) -> ChunkOwner:
        rx = self._rx
        if rx is None:
            raise ValueError(f"{self!r} used after release")
        return rx

    def release(self) -> None:
        """Hand the memory back; safe from any thread. Releasing twice raises ValueError."""
        rx = self._rx
        if rx is None:
            raise ValueError(f"{self!r} released twice")
        self._rx = None
        if rx.debug:
            rx.revoke(self)
        # RxCore.put_many, inlined: this runs once per chunk on the iterator path.
        rx.queue.append(self)
        if rx.waiting:
            rx.signal()
        if rx.closed:
            rx.late_release()

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rx is not None:
            self.release()

    def __len__(self) -> int:
        return self._length


class Chunk(Held):
    """Received bytes at ``offset`` in the area, ``length`` long; ``stream_offset`` is their
    position in the TCP byte stream. A coalesced chunk spans several kernel buffers (``parts``)."""

    __slots__ = ("_offset",)
    offset: int  #: where the bytes are in the area (read-only)
    parts = 1  # CoalescedChunk overrides

    def __init__(self, rx: ChunkOwner, offset: int, length: int, token: int,
                 stream_offset: int) -> None:
        self._rx = rx
        self._offset = offset
        self._length = length
        self._tok = token
        self._stream_offset = stream_offset

    @property
    def data(self) -> memoryview:
        """Zero-copy read-write view of the bytes."""
        rx = self._rx
        if rx is None:  # _owner(), inline: this runs once per chunk on the callback path
            raise ValueError(f"{self!r} used after release")
        mv = rx.view[self._offset:self._offset + self._length]
        if rx.debug:
            rx.track(self, mv)
        return mv

    @property
    def array(self) -> np.ndarray:
        """Zero-copy numpy uint8 array over the bytes."""
        rx = self._owner()
        arr = np.frombuffer(self.data, dtype=np.uint8)
        if rx.debug:
            rx.track(self, weakref.ref(arr))
        return arr

    def __bytes__(self) -> bytes:
        return bytes(self.data)

    def __repr__(self) -> str:
        state = "released" if self._rx is None else "held"
        return (f"<Chunk offset={self.offset} length={self.length} "
                f"stream_offset={self.stream_offset} parts={self.parts} {state}>")


class CoalescedChunk(Chunk):
    """Neighbouring buffers in the area taken as one chunk; released together."""

    __slots__ = ("_lens", "_parts")

    def __init__(self, rx: ChunkOwner, offset: int, tokens: list[int], lengths: list[int],
                 stream_offset: int) -> None:
        super().__init__(rx, offset, sum(lengths), 0, stream_offset)
        self._tok = tokens
        self._lens = lengths
        self._parts = len(tokens)


class LinearChunk(Chunk):
    """Bytes that did not land in the area (devmem linear data): a private copy; ``offset`` is
    -1 and releasing it only does the accounting."""

    __slots__ = ("_buf",)

    def __init__(self, rx: ChunkOwner, data: bytes, stream_offset: int) -> None:
        super().__init__(rx, -1, len(data), -1, stream_offset)
        self._buf = data

    @property
    def data(self) -> memoryview:
        self._owner()
        return memoryview(self._buf)


class Batch(Held):
    """Everything one kernel round delivered, in stream order, as parallel sequences:
    ``offsets`` and ``lengths`` of each buffer in the area (``offset`` -1: a linear copy, see
    ``views``). Providers that vectorize (soft) give numpy arrays, so a batch holds no Python
    object per buffer; others give lists. One ``release()`` returns them all."""

    __slots__ = ("_lengths", "_linear", "_offsets")
    offsets: IntSeq  #: each buffer's offset in the area, a list or numpy array (read-only)
    lengths: IntSeq  #: each buffer's bytes (read-only)

    def __init__(self, rx: ChunkOwner, d: Delivery, stream_offset: int, nbytes: int) -> None:
        self._rx = rx
        self._offsets = d.offsets
        self._lengths = d.lengths
        self._tok = d.tokens
        self._linear = d.linear or None
        self._stream_offset = stream_offset
        self._length = nbytes

    @property
    def parts(self) -> int:
        return len(self._offsets)

    def views(self, coalesce: bool = False) -> list[memoryview]:
        """Zero-copy memoryviews in stream order; ``coalesce`` merges area neighbours."""
        rx = self._owner()
        v = rx.view
        offs, lens = as_list(self._offsets), as_list(self._lengths)
        if self._linear:
            out = [memoryview(self._linear[i]) if i in self._linear else v[o:o + n]
                   for i, (o, n) in enumerate(zip(offs, lens, strict=True))]
        elif coalesce:
            out = [v[offs[a]:offs[a] + sum(lens[a:b])] for a, b in contiguous_runs(offs, lens)]
        else:
            out = [v[o:o + n] for o, n in zip(offs, lens, strict=True)]
        if rx.debug:
            for mv in out:
                rx.track(self, mv)
        return out

    def arrays(self, coalesce: bool = False) -> list[np.ndarray]:
        """Zero-copy numpy uint8 arrays in stream order."""
        return [np.frombuffer(mv, dtype=np.uint8) for mv in self.views(coalesce)]

    def __repr__(self) -> str:
        state = "released" if self._rx is None else "held"
        return (f"<Batch parts={len(self.offsets)} length={self.length} "
                f"stream_offset={self.stream_offset} {state}>")


#: The slots the compiled paths fill when they make a chunk and read when it comes back
#: (zcnet.rx.zc._rxaccel's ``bind``, zcnet.aio._loopaccel's ``Round``), handed to them once in
#: this order as member descriptors, so the C names none: Held's owner, token, length and
#: stream offset, then Chunk's offset.
CHUNK_SLOTS = slot_members(Chunk, "_rx", "_tok", "_length", "_stream_offset", "_offset")
#: A Batch's, for the compiled round that makes batches: Held's four, then its offsets, lengths
#: and linear copies.
BATCH_SLOTS = slot_members(Batch, "_rx", "_tok", "_length", "_stream_offset", "_offsets",
                           "_lengths", "_linear")


def _read_only(cls: type, *names: str) -> None:
    """``cls.<name>`` for each name: a read-only view of the slot ``_<name>`` (see the module
    docstring). The accelerator's is a member descriptor at the slot's offset (handed the slot's
    own descriptor); without it, a property (about 30 ns more per read)."""
    accel = rx_accel_for("c")
    for name in names:
        view = (property(operator.attrgetter(f"_{name}")) if accel is None
                else accel.readonly_slot(*slot_members(cls, f"_{name}"), name))
        setattr(cls, name, view)


_read_only(Held, "length", "stream_offset")
_read_only(Chunk, "offset")
_read_only(CoalescedChunk, "parts")
_read_only(Batch, "offsets", "lengths")
