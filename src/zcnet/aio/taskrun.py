"""Which task-run mode the loop's own rings use (the shared soft ring, the async sender's):
DEFER_TASKRUN where the kernel tells the loop about arriving data at once, COOP_TASKRUN where
it does not.

Some facts, measured here:

- With DEFER_TASKRUN, data for an armed receive queues task work and signals the ring's
  eventfd (zcnet.aio.wakeup). On Linux 6.18.44 as built here (HZ=250, RCU_LAZY) that signal,
  raised in the receive softirq, comes an RCU grace period late: 13-16 ms, although
  IORING_SQ_TASKRUN is set within ~50 us. Every idle connection's round trip took 16 ms
  (benchmarks/aio_echo.py, 1 client: 16 ms against uvloop's 80 us) and one stream on one CPU
  ran at 0.12x uvloop (benchmarks/aio_stream.py).
- With COOP_TASKRUN the completion is posted in the loop thread itself, when it next leaves the
  kernel (its epoll wait included), and the eventfd is signalled there, at once (~80 us).
- Where DEFER_TASKRUN's signal is prompt it stays the better mode: the loop thread is not
  interrupted per arriving request (docs/aio.md, "Design alternatives").

So the first ring asks the kernel, once per process: a loopback TCP pair, a DEFER_TASKRUN
ring with an eventfd and one receive armed; a byte sent from this thread has raised the
eventfd by the time ``send`` returns when the signal is prompt (the softirq ran inside the
send). ``ZCNET_AIO_TASKRUN=defer|coop`` decides instead (a benchmark's A/B). zcrx rings need
DEFER_TASKRUN whatever this says (docs/aio.md, zcrx: the loop thread's queue).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import socket

from zcnet.errors import UsageError, ZcnetError
from zcnet.uapi import io_uring as u
from zcnet.uring.eventfd import drain, register_eventfd
from zcnet.uring.ring import Ring

ENV = "ZCNET_AIO_TASKRUN"
MODES = {"defer": u.IORING_SETUP_DEFER_TASKRUN, "coop": u.IORING_SETUP_COOP_TASKRUN}


@functools.cache
def taskrun_flag() -> int:
    """IORING_SETUP_DEFER_TASKRUN or IORING_SETUP_COOP_TASKRUN for the loop's rings."""
    forced = os.environ.get(ENV, "")
    if forced:
        if forced not in MODES:
            raise UsageError(f"{ENV}={forced!r} is not a task-run mode",
                             f"set it to one of {', '.join(MODES)}, or unset it")
        return MODES[forced]
    return MODES["defer" if signal_is_prompt() else "coop"]


@functools.cache
def signal_is_prompt() -> bool:
    """deferred_signal_is_prompt, asked once per process (zcrx queues on a loop ask it)."""
    return deferred_signal_is_prompt()


def taskrun_name() -> str:
    """"defer" or "coop": what taskrun_flag() chose (for reports)."""
    return "defer" if taskrun_flag() == MODES["defer"] else "coop"


def deferred_signal_is_prompt() -> bool:
    """Whether a DEFER_TASKRUN ring's eventfd is signalled inside the system call that brought
    the data (see the module docstring). True also when the probe cannot run (no loopback):
    the rings then open as before and report their own errors."""
    with contextlib.ExitStack() as stack:
        try:
            srv = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
            tx = stack.enter_context(socket.create_connection(srv.getsockname()[:2]))
            rx = stack.enter_context(srv.accept()[0])
            ring = stack.enter_context(Ring(4, flags=u.IORING_SETUP_SINGLE_ISSUER
                                            | u.IORING_SETUP_DEFER_TASKRUN))
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            stack.callback(os.close, efd)
            register_eventfd(ring, efd)
            buf = ctypes.create_string_buffer(64)  # outlives the ring (closed first)
            ring.prep(u.IORING_OP_RECV, rx.fileno(), ctypes.addressof(buf), len(buf))
            ring.submit()
            tx.send(b"x")
            prompt = drain(efd) > 0
            ring.get_events()  # the receive completes: nothing in flight at close
            return prompt
        except (OSError, ZcnetError):  # no loopback here, io_uring refused: the rings say why
            return True
