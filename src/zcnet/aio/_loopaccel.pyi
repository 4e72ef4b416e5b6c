"""Type stub for zcnet.aio._loopaccel (aio/_c/): the event loop's shared-ring pass in C. Each
object is made by zcnet.aio (shared.py, receiver.py, sender.py) with the Python objects it
works on, and answers FALLBACK wherever the Python code must run instead.
tests/project/test_stubs.py holds this file to the module (names, parameters, arity)."""

import asyncio
import socket
from collections import deque
from collections.abc import Awaitable, Callable

from zcnet.aio.loop_soft import OnLoopRing
from zcnet.aio.pool import Pool
from zcnet.aio.protocol import ZcTransport
from zcnet.aio.receiver import AsyncReceiver
from zcnet.aio.sender import AsyncSender
from zcnet.aio.shared import MemberRing
from zcnet.errors import ClosedError
from zcnet.rx.zc.bookkeeping import Stats
from zcnet.rx.zc.chunks import Batch, Chunk, Held
from zcnet.rx.zc.core import RxCore
from zcnet.uring.bufring import BufRing
from zcnet.uring.completions import Completions
from zcnet.uring.ring import Ring

DONE: int
AGAIN: int
FALLBACK: int
STOPPED: int

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
    """One transport's (or AsyncReceiver's: ``transport`` None) receive round
    (zcnet.aio.shared.compiled_round); without ``batch_cls``, take_batch answers FALLBACK."""

    def __init__(self, transport: ZcTransport | None, rx: RxCore, member: MemberRing,
                 provider: OnLoopRing, bufring: BufRing, chunk_cls: type[Chunk],
                 release_queue: deque[Held], stats: Stats, recv_ud: int, f_more: int,
                 buffer_shift: int, batch_cls: type[Batch] = ..., pool: Pool | None = None,
                 /) -> None: ...
    def run(self) -> int: ...
    def take(self) -> list[Chunk] | int: ...
    def take_batch(self) -> Batch | int: ...
    def write(self, data: bytes | bytearray | memoryview, /) -> None: ...

class Anext:
    """An AsyncReceiver's ``__anext__``: each call, an awaitable for one chunk."""

    def __init__(self, round: Round, receiver: AsyncReceiver, member: MemberRing,
                 owner_tid: int, is_running: Callable[[], bool],
                 create_future: Callable[[], asyncio.Future[None]], pending: deque[Chunk],
                 py_anext: Callable[[], Awaitable[Chunk]], closed_error: type[ClosedError],
                 /) -> None: ...
    def __call__(self) -> Awaitable[Chunk]: ...

class CopySend:
    """An AsyncSender's copy ``sendall``, its common case: the bytes the socket took, True
    when it took all."""

    def __init__(self, sender: AsyncSender, sock: socket.socket, owner_tid: int,
                 is_running: Callable[[], bool], /) -> None: ...
    def __call__(self, data: bytes | bytearray | memoryview, /) -> int | bool: ...
