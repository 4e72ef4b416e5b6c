"""The three io_uring syscalls through ctypes; the one place a negative result becomes OSError."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
from collections.abc import Callable
from types import MemberDescriptorType, ModuleType

from zcnet.errors import Unsupported, UsageError
from zcnet.uapi import io_uring as u

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


def cqe_error(res: int, what: str = "") -> OSError:
    """The OSError for a negative CQE ``res`` (or syscall result), errno intact."""
    err = -res
    msg = os.strerror(err)
    return OSError(err, f"{what}: {msg}" if what else msg)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def io_uring_setup(entries: int, params: u.io_uring_params) -> int:
    """io_uring_setup, naming the kernel a CQE_MIXED ring needs (older ones say EINVAL)."""
    mixed = params.flags & u.IORING_SETUP_CQE_MIXED
    if mixed and params.flags & u.IORING_SETUP_CQE32:
        raise UsageError("Ring: IORING_SETUP_CQE_MIXED and IORING_SETUP_CQE32 both given",
                         "take one: CQE32 makes every CQE 32 bytes, CQE_MIXED only those "
                         "that need it")
    ret = _syscall(u.__NR_io_uring_setup, ctypes.c_uint(entries), ctypes.byref(params))
    if ret < 0 and mixed and ctypes.get_errno() == errno.EINVAL:
        raise Unsupported(f"this kernel ({os.uname().release}) does not take "
                          "IORING_SETUP_CQE_MIXED (CQEs of 16 and 32 bytes in one ring)",
                          "it needs Linux 6.18 or newer; use IORING_SETUP_CQE32 here")
    return _check(ret, "io_uring_setup")


def io_uring_enter(fd: int, to_submit: int, min_complete: int, flags: int,
                   arg: ctypes.Structure | None = None, *, retry_eintr: bool = True) -> int:
    """One io_uring_enter; retries EINTR so a signal never loses a submission count.

    ``arg`` is an io_uring_getevents_arg for IORING_ENTER_EXT_ARG (a wait with a timeout).
    Its timeout is relative, so a caller with a deadline passes ``retry_eintr=False``, gets
    InterruptedError, and retries with what is left (the kernel returns EINTR only when it
    submitted nothing).
    """
    parg = ctypes.byref(arg) if arg is not None else None
    argsz = ctypes.sizeof(arg) if arg is not None else 0
    while True:
        ret = _syscall(u.__NR_io_uring_enter, ctypes.c_int(fd), ctypes.c_uint(to_submit),
                       ctypes.c_uint(min_complete), ctypes.c_uint(flags), parg,
                       ctypes.c_size_t(argsz))
        if ret >= 0:
            return ret
        err = ctypes.get_errno()
        if err != errno.EINTR or not retry_eintr:
            raise OSError(err, f"io_uring_enter: {os.strerror(err)}")


#: The pure-Python hot path's io_uring_enter: ``fn(fd, to_submit, min_complete, flags, None, 0)``.
#: Plain ints (ctypes passes them as C ints, sign-extended to the 64-bit registers), no
#: argtypes conversion and no Python frame: ~0.35 us over the syscall instead of ~0.8 us.
#: Returns the raw result; on a negative one, redo the call through ``io_uring_enter``, which
#: reads errno (the kernel returns an error only when it consumed no SQE, so redoing is safe).
#: The last two arguments must be given: no EXT_ARG means the kernel reads them as a sigmask.
_enter_pure = functools.partial(_syscall, u.__NR_io_uring_enter)

try:  # the optional compiled accelerator (setup.py builds it when a compiler exists)
    from zcnet.uring import _accel
except ImportError:  # not built: the pure path runs
    _accel = None  # type: ignore[assignment]


def accel_available() -> bool:
    """Whether the compiled accelerator was built and imports."""
    return _accel is not None


def backend() -> str:
    """The hot path a Ring made now runs: "c" (the accelerator) or "pure" (Python only).

    ZCNET_PURE=1 in the environment selects "pure" even when the accelerator is built. Read
    when a Ring is made, so a test can make rings of both kinds in one process.
    """
    if _accel is None or os.environ.get("ZCNET_PURE", "") not in ("", "0"):
        return "pure"
    return "c"


def accel_for(kind: str) -> ModuleType | None:
    """The compiled accelerator module when backend ``kind`` is "c" (else None): for callers
    above the ring with a hot loop of their own (the zero-copy receiver's chunks)."""
    return _accel if kind == "c" else None


def slot_members(cls: type, *names: str) -> tuple[MemberDescriptorType, ...]:
    """``cls``'s __slots__ members ``names`` as their descriptors, in that order: the form a
    class hands the fields its compiled twin reads and writes in place (zcnet/_members.h), once,
    so the C keeps their offsets and names none of them."""
    out = tuple(getattr(cls, name) for name in names)
    bad = [n for n, d in zip(names, out, strict=True) if type(d) is not MemberDescriptorType]
    if bad:
        raise TypeError(f"{cls.__qualname__}: not __slots__ members: {', '.join(bad)}")
    return out


def enter_fast_for(kind: str) -> Callable[[int, int, int, int, None, int], int]:
    """The hot io_uring_enter of backend ``kind``: ``fn(fd, to_submit, min_complete, flags,
    None, 0)`` returns the result, or a negative number on failure (then redo the call through
    ``io_uring_enter`` for the errno; safe, as the kernel consumed no SQE)."""
    if kind == "c" and _accel is not None:
        return _accel.enter  # type: ignore[no-any-return]
    return _enter_pure  # type: ignore[return-value]


def io_uring_register(fd: int, opcode: int, arg: object, nr_args: int) -> int:
    """``arg`` is a ctypes object passed by reference, an address (int), or None."""
    if arg is None:
        parg: object = None
    elif isinstance(arg, int):
        parg = ctypes.c_void_p(arg)
    else:
        parg = ctypes.byref(arg)  # type: ignore[arg-type]
    ret = _syscall(u.__NR_io_uring_register, ctypes.c_int(fd), ctypes.c_uint(opcode), parg,
                   ctypes.c_uint(nr_args))
    return _check(ret, f"io_uring_register({opcode})")
