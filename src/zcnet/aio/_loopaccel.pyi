"""Type stub for zcnet.aio._loopaccel (aio/_c/): the event loop's shared-ring pass in C. Each
object is made by zcnet.aio (shared.py, receiver.py, sender.py) with the Python objects it
works on, and answers FALLBACK wherever the Python code must run instead.

The parameters below are the contract: the C reads and writes the public fields of what it is
handed (state records such as TransportState and ResourceState, the core, the member, the
stats), fills slots it is handed as member descriptors, and calls what it is handed as
callables. It names no private attribute (tests/project/test_code_guard.py).
tests/project/test_stubs.py holds this file to the module (names, parameters, arity)."""

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from types import MemberDescriptorType

from zcnet.aio.loop import ResourceState
from zcnet.aio.loop_soft import OnLoopRing
from zcnet.aio.pool import Pool
from zcnet.aio.protocol import ZcTransport
from zcnet.aio.shared import MemberRing, TransportCalls
from zcnet.errors import ClosedError
from zcnet.rx.zc.bookkeeping import Stats
from zcnet.rx.zc.chunks import Batch, Chunk, Held
from zcnet.rx.zc.core import RxCore
from zcnet.tx.senders import SendStats
from zcnet.uring.bufring import BufRing
from zcnet.uring.completions import Completions
from zcnet.uring.ring import Ring

DONE: int
AGAIN: int
FALLBACK: int
STOPPED: int
#: the receive phases the round works in and the two changes it makes (STOPPED+ARM,
#: ARMED+STOP), read at import from zcnet.rx.zc.core.TRANSITIONS
PHASES: dict[str, int]

def cqe_layout() -> dict[str, int]: ...
def bufring_layout() -> dict[str, int]: ...

class Router:
    """The shared ring's CQEs routed to its members (zcnet.aio.shared.LoopRing)."""

    def __init__(self, ring: Ring, members: dict[int, MemberRing], khead: int, ktail: int,
                 cqes: int, mask: int, cqe_size: int,
                 completions_of: Callable[[bytearray, int, bool], Completions], few: int,
                 sq_flags: int, work_mask: int, getevents: int, local_bits: int, /) -> None: ...
    def route(self) -> int: ...
    def poll(self, entered: bool, efd: int, /) -> int: ...

class Round:
    """One transport's (or AsyncReceiver's: ``transport`` and ``calls`` None) receive round
    (zcnet.aio.shared.compiled_round); without ``batch_cls``, take_batch answers FALLBACK.

    What it reads and writes is handed over here, never looked up by a private name: the
    transport's steps it calls back (``calls``: zcnet.aio.shared.TransportCalls), the slots of
    the chunks and batches it makes as member descriptors (``chunk_slots``, ``batch_slots``:
    zcnet.rx.zc.chunks.CHUNK_SLOTS, BATCH_SLOTS), and objects whose public fields it reads in
    place (the transport's ``st``, a TransportState, and ``protocol``; the core, the member,
    the buffer ring and the stats)."""

    def __init__(self, transport: ZcTransport | None, calls: TransportCalls | None, rx: RxCore,
                 member: MemberRing, provider: OnLoopRing, bufring: BufRing,
                 chunk_cls: type[Chunk], chunk_slots: tuple[MemberDescriptorType, ...],
                 release_queue: deque[Held], stats: Stats, recv_ud: int, f_more: int,
                 buffer_shift: int, batch_cls: type[Batch] = ...,
                 batch_slots: tuple[MemberDescriptorType, ...] = ..., pool: Pool | None = None,
                 /) -> None: ...
    def run(self) -> int: ...
    def take(self) -> list[Chunk] | int: ...
    def take_batch(self) -> Batch | int: ...
    def write(self, data: bytes | bytearray | memoryview, /) -> None: ...

class Anext:
    """An AsyncReceiver's ``__anext__``: each call, an awaitable for one chunk. It is handed
    the receiver's ResourceState (``closed``, read in place), its pending chunks and its steps
    (``py_anext``: the Python ``__anext__``; ``drop_pending``: release the pending chunks of
    a receiver closed meanwhile), never the receiver itself."""

    def __init__(self, round: Round, state: ResourceState, member: MemberRing,
                 owner_tid: int, is_running: Callable[[], bool],
                 create_future: Callable[[], asyncio.Future[None]], pending: deque[Chunk],
                 py_anext: Callable[[], Awaitable[Chunk]], drop_pending: Callable[[], None],
                 closed_error: type[ClosedError], /) -> None: ...
    def __call__(self) -> Awaitable[Chunk]: ...

class CopySend:
    """An AsyncSender's copy ``sendall``, its common case: the bytes the socket took, True
    when it took all, counted in ``stats`` (the sender's). The sender calls it only while it
    is open with no send in flight."""

    def __init__(self, stats: SendStats, sock: socket.socket, owner_tid: int,
                 is_running: Callable[[], bool], /) -> None: ...
    def __call__(self, data: bytes | bytearray | memoryview, /) -> int | bool: ...
