"""Type stub for zcnet.uring._accel (uring/_accel.c, _accel_bufring.c): the ring's hot path
and the provided-buffer ring's writes. Each entry point's Python twin is in ``TWINS``; the
bufring functions answer None for anything but the common case (then the twin runs).
tests/project/test_stubs.py holds this file to the module (names, parameters, arity)."""

from collections.abc import Callable, Sequence
from types import MemberDescriptorType

import numpy as np

from zcnet.errors import ClosedError
from zcnet.uring.completions import Completions
from zcnet.uring.mem import Mapping
from zcnet.uring.ring import Ring

#: entry point -> the qualified name of the Python code it stands for
TWINS: dict[str, str]

def enter(fd: int, to_submit: int, min_complete: int, flags: int, arg: int | None,
          argsz: int, /) -> int: ...
def cqe_layout() -> dict[str, int]: ...
def bufring_layout() -> dict[str, int]: ...
def buf_provide(mem: memoryview | bytearray, entries: int, tail: int, bids: Sequence[int],
                base: int, buf_size: int, /) -> int | None: ...
def buf_in_step(mem: memoryview | bytearray, entries: int, head: int,
                bids: Sequence[int], /) -> bool: ...

class Core:
    """The Ring's hot methods over its mapped memory (zcnet.uring.accel_bind makes it). Each
    method has the signature of the Ring method it stands for, which is its slow path."""

    def __init__(self, ring: Ring, closed_error: type[ClosedError],
                 completions_of: type[Completions],
                 completions_slots: tuple[MemberDescriptorType, ...], keep: tuple[Mapping, ...],
                 slow: tuple[Callable[..., object], ...], cqe32: int, f32: int, fskip: int,
                 fd: int, sq_addr: int,
                 khead: int, ktail: int, cq_addr: int, kcq_head: int, kcq_tail: int,
                 sqes_addr: int, sq_mask: int, sq_entries: int, sqe_size: int, cqes_addr: int,
                 cq_mask: int, cqe_size: int, closed: int, /) -> None: ...
    @property
    def users(self) -> int: ...
    def prep(self, opcode: int, fd: int = -1, addr: int = 0, length: int = 0, off: int = 0,
             user_data: int = 0, *, flags: int = 0, ioprio: int = 0, op_flags: int = 0,
             buf_index: int = 0, file_index: int = 0, addr3: int = 0) -> int: ...
    def submit(self, wait_nr: int = 0, timeout: float | None = None) -> int: ...
    def prep_batch(self, opcode: int, user_data: np.ndarray, *, fd: int = -1,
                   addr: int | np.ndarray = 0, length: int | np.ndarray = 0, flags: int = 0,
                   ioprio: int = 0, op_flags: int = 0, buf_index: int = 0) -> None: ...
    def reap(self, max_n: int | None = None) -> Completions: ...
    def reap_one(self) -> tuple[int, int, int] | None: ...
    def close(self, ring: Ring | None = None, /) -> None: ...
