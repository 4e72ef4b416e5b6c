"""Binding the compiled accelerator (zcnet.uring._accel) to a ring: its Core's ``prep``,
``prep_batch``, ``submit``, ``reap`` and ``reap_one`` are set on the ring instance, over the
class's Python methods, which stay the Core's slow paths."""

from __future__ import annotations

from zcnet.errors import ClosedError
from zcnet.uapi import io_uring as u
from zcnet.uring.completions import C_SLOTS, Completions
from zcnet.uring.layout import RingMemory
from zcnet.uring.mem import Mapping
from zcnet.uring.syscall import accel_for

#: The methods the Core runs, each with the Python method it falls back to (``_<name>_py``).
ACCEL_METHODS = ("prep", "prep_batch", "submit", "reap", "reap_one")
#: The Ring methods the Core's slow paths call, handed over once in this order (SLOW_* in
#: _accel.c): the Core looks none up by name.
SLOW_PATHS = ("_prep_py", "_prep_batch_py", "_submit_py", "_submit_slow", "_reap_py",
              "_release_fd")


def bind_accel(ring: object, fd: int, maps: list[Mapping], mem: RingMemory,
               p: u.io_uring_params) -> object:
    """Build the Core over ``mem`` and bind its methods on ``ring``, except those a subclass
    overrides (there ``type(ring).<name>`` is no longer the class's ``_<name>_py``).
    Returns the Core (``close()`` it before unmapping)."""
    accel = accel_for("c")
    assert accel is not None  # backend() said "c"
    cls = type(ring)
    # A CQE_MIXED ring: 16-byte slots, reaps widened to 32-byte entries (zcnet.uring.mixed).
    mixed = bool(p.flags & u.IORING_SETUP_CQE_MIXED)
    f32, fskip = (u.IORING_CQE_F_32, u.IORING_CQE_F_SKIP) if mixed else (0, 0)
    core = accel.Core(ring, ClosedError, Completions, C_SLOTS, tuple(maps),
                      tuple(getattr(cls, name) for name in SLOW_PATHS),
                      int(mem.cqe_size == 32 or mixed), f32, fskip,
                      fd, mem.sq.addr, p.sq_off.head, p.sq_off.tail,
                      mem.cq.addr, p.cq_off.head, p.cq_off.tail, mem.sqes.addr,
                      mem.sq_mask, p.sq_entries, mem.sqe_size,
                      mem.cq.addr + p.cq_off.cqes, mem.cq_mask, mem.cqe_size, 0)
    for name in ACCEL_METHODS:
        if getattr(cls, name) is getattr(cls, f"_{name}_py"):  # not overridden: take it
            ring.__dict__[name] = getattr(core, name)
    return core
