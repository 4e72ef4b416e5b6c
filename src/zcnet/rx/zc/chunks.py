"""What a Receiver hands out: Chunks (one buffer or a run of neighbours) and Batches (one
kernel round), each held until released. A chunk is a view into the registered area; releasing
it queues its token for the owner thread to give back to the kernel (see receiver.py).
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import numpy as np

from zcnet.rx.zc.bookkeeping import ReleaseQueue, contiguous_runs
from zcnet.rx.zc.provider import Delivery


class ChunkOwner(Protocol):
    """The receiver side chunks talk to (zcnet.rx.zc.receiver.Receiver)."""

    debug: bool
    _view: memoryview
    _releases: ReleaseQueue
    _closed: bool

    def _track(self, held: _Held, view: Any) -> None: ...

    def _revoke(self, held: _Held) -> None: ...

    def _release_after_close(self) -> None: ...


def _as_list(seq: Any) -> list[int]:
    """A provider's offsets/lengths/tokens as a list of ints (providers that vectorize give
    numpy arrays; the per-chunk paths need Python ints anyway)."""
    return seq.tolist() if type(seq) is np.ndarray else seq  # type: ignore[no-any-return]


class _Held:
    """Something the application holds until it releases it: a Chunk or a Batch.

    ``_rx`` is the owning receiver while held and None once released; only the holder writes
    it, so checking it needs no lock. ``_tok`` is the provider's token (int) or tokens (list).
    """

    __slots__ = ("_rx", "_tok", "length", "stream_offset")
    _rx: ChunkOwner | None
    _tok: Any
    length: int
    stream_offset: int

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
            rx._revoke(self)
        # ReleaseQueue.put, inlined: this runs once per chunk on the iterator path.
        q = rx._releases
        q._q.append(self)
        if q._waiting:
            q._signal()
        if rx._closed:
            rx._release_after_close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._rx is not None:
            self.release()

    def __len__(self) -> int:
        return self.length


class Chunk(_Held):
    """Received bytes at ``offset`` in the area, ``length`` long; ``stream_offset`` is their
    position in the TCP byte stream. A coalesced chunk spans several kernel buffers (``parts``)."""

    __slots__ = ("offset",)
    parts = 1  # CoalescedChunk overrides

    def __init__(self, rx: ChunkOwner, offset: int, length: int, token: int,
                 stream_offset: int) -> None:
        self._rx = rx
        self.offset = offset
        self.length = length
        self._tok = token
        self.stream_offset = stream_offset

    @property
    def data(self) -> memoryview:
        """Zero-copy read-write view of the bytes."""
        rx = self._rx
        if rx is None:  # _owner(), inline: this runs once per chunk on the callback path
            raise ValueError(f"{self!r} used after release")
        mv = rx._view[self.offset:self.offset + self.length]
        if rx.debug:
            rx._track(self, mv)
        return mv

    @property
    def array(self) -> np.ndarray:
        """Zero-copy numpy uint8 array over the bytes."""
        rx = self._owner()
        arr = np.frombuffer(self.data, dtype=np.uint8)
        if rx.debug:
            rx._track(self, weakref.ref(arr))
        return arr

    def __bytes__(self) -> bytes:
        return bytes(self.data)

    def __repr__(self) -> str:
        state = "released" if self._rx is None else "held"
        return (f"<Chunk offset={self.offset} length={self.length} "
                f"stream_offset={self.stream_offset} parts={self.parts} {state}>")


class CoalescedChunk(Chunk):
    """Neighbouring buffers in the area taken as one chunk; released together."""

    __slots__ = ("_lens", "parts")  # type: ignore[misc]

    def __init__(self, rx: ChunkOwner, offset: int, tokens: list[int], lengths: list[int],
                 stream_offset: int) -> None:
        super().__init__(rx, offset, sum(lengths), 0, stream_offset)
        self._tok = tokens
        self._lens = lengths
        self.parts = len(tokens)


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


class Batch(_Held):
    """Everything one kernel round delivered, in stream order, as parallel sequences:
    ``offsets`` and ``lengths`` of each buffer in the area (``offset`` -1: a linear copy, see
    ``views``). Providers that vectorize (soft) give numpy arrays, so a batch holds no Python
    object per buffer; others give lists. One ``release()`` returns them all."""

    __slots__ = ("_linear", "lengths", "offsets")

    def __init__(self, rx: ChunkOwner, d: Delivery, stream_offset: int, nbytes: int) -> None:
        self._rx = rx
        self.offsets = d.offsets
        self.lengths = d.lengths
        self._tok = d.tokens
        self._linear = d.linear or None
        self.stream_offset = stream_offset
        self.length = nbytes

    @property
    def parts(self) -> int:
        return len(self.offsets)

    def views(self, coalesce: bool = False) -> list[memoryview]:
        """Zero-copy memoryviews in stream order; ``coalesce`` merges area neighbours."""
        rx = self._owner()
        v = rx._view
        offs, lens = _as_list(self.offsets), _as_list(self.lengths)
        if self._linear:
            out = [memoryview(self._linear[i]) if i in self._linear else v[o:o + n]
                   for i, (o, n) in enumerate(zip(offs, lens, strict=True))]
        elif coalesce:
            out = [v[offs[a]:offs[a] + sum(lens[a:b])] for a, b in contiguous_runs(offs, lens)]
        else:
            out = [v[o:o + n] for o, n in zip(offs, lens, strict=True)]
        if rx.debug:
            for mv in out:
                rx._track(self, mv)
        return out

    def arrays(self, coalesce: bool = False) -> list[np.ndarray]:
        """Zero-copy numpy uint8 arrays in stream order."""
        return [np.frombuffer(mv, dtype=np.uint8) for mv in self.views(coalesce)]

    def __repr__(self) -> str:
        state = "released" if self._rx is None else "held"
        return (f"<Batch parts={len(self.offsets)} length={self.length} "
                f"stream_offset={self.stream_offset} {state}>")
