"""Misuse that the compiled paths once crashed or hung on, as a table run on both paths: the table
behind tests/project/test_misuse_both_paths.py. ``python misuse_cases.py NAME`` runs case NAME on
the path ZCNET_PURE selects and prints its outcome as one line, ``OUTCOME <json>``. The test runs
each case in a child process per path, so a crash or a hang fails the case instead of the run, and
holds both outcomes to the case's ``expected``: the same exception types, or none. The messages
of those exceptions are compared too: the same on both paths, or, for a sweep or a race (where
the collector or the other thread lands decides what is raised), each one among the case's
``messages``.

- fields: a chunk's public fields replaced with an object whose ``__index__`` closes the
  receiver (refused: they are read-only); a chunk built by hand with such a length, and a
  receiver's counter replaced with one (TypeError on both: the C reads ints only).
- reentry-*: a finalizer (``__del__`` of garbage the collector finds during the call) that
  receives, iterates, flushes, releases or closes inside a receive, flush or close of the same
  receiver. Each sweeps the collector across the call's allocations (``slack``); every pass
  that fired is summed up as "outer=<what the call raised> fin=<what the finalizer's action
  raised> after=<the receiver's state after>" and the set of those is the outcome.
- abandoned-*: a receive awaitable of zcnet.aio stepped once, then closed, thrown into or
  dropped; the next receive must work (on asyncio, uvloop and trio).
- ring-*: a Ring closed by another thread while it is in use.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "reentry"))

from common import Bomb, collect_at_next_allocation, pair, restore_collector

SMALL = {"area_size": 256 << 10, "buf_size": 4096}
FIRST, SECOND, LAST = 20000, 30000, 5000  # bytes sent before, during and after the misuse
SLACKS = range(0, 40)  # where the collector runs: the slack-th allocation after arming


@dataclass
class Case:
    run: Callable[[], Any]
    expected: Any
    #: None: both paths raise the same messages; else every message either may raise
    messages: frozenset[str] | None = None


CASES: dict[str, Case] = {}


def case(expected: Any, messages: frozenset[str] | None = None
         ) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def add(fn: Callable[[], Any]) -> Callable[[], Any]:
        CASES[fn.__name__.replace("_", "-")] = Case(fn, expected, messages)
        return fn
    return add


FIX_CLOSED = " (fix: it cannot be used after close(); open a new one)"


def closed(what: str) -> str:
    """The message of the ClosedError ``what`` raises once closed (``what``: "recv() on a
    closed Receiver", say)."""
    return f"ClosedError: {what}{FIX_CLOSED}"


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    ls = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(ls.getsockname())
    s, _ = ls.accept()
    ls.close()
    return c, s


#: Every exception a case saw, as "Type: message" (the test compares these across paths).
MESSAGES: set[str] = set()


def kind(e: BaseException | None) -> str:
    """"ok", or the exception's type name (its message goes to MESSAGES)."""
    if e is None:
        return "ok"
    MESSAGES.add(f"{type(e).__name__}: {e}")
    return type(e).__name__


def outcome_of(fn: Callable[[], Any]) -> str:
    """"ok", or the type of the exception ``fn()`` raised."""
    try:
        fn()
    except Exception as e:
        return kind(e)
    return "ok"


def abandon(step: Any, how: str) -> None:
    """End an awaitable that was stepped once: close it or throw into it; "drop" leaves it to
    the caller's ``del`` and the collector."""
    if how == "close":
        step.close()
    elif how == "throw":
        with contextlib.suppress(RuntimeError):
            step.throw(RuntimeError("thrown"))


class Evil:
    """An int-like whose ``__index__`` closes the receiver: C that converted it would run
    Python between reading a receiver's state and writing it. ``called`` says whether any
    code did."""

    called = False

    def __init__(self, close: Callable[[], object]) -> None:
        self.close = close

    def __index__(self) -> int:
        Evil.called = True
        self.close()
        return 4096

    __int__ = __index__


def receive_all(rx: Any, held: list[Any]) -> None:
    """Release ``held``, end the stream's last bytes' wait with the peer's FIN already sent,
    and read to EOF, releasing everything."""
    for h in held:
        if h is not None and h._rx is not None:
            h.release()
    held.clear()
    while True:
        got = rx.recv(5)
        if not got:
            assert rx.eof, "no EOF"
            return
        for h in got:
            h.release()


def state_after(rx: Any, total: int) -> str:
    """What a receiver looks like once the test let go of it: "consistent" (every byte
    delivered once and given back, the buffer ring full), "closed-freed" (closed, and its area
    handed back once nothing is held: unmapped, or kept by zcnet.aio's loop) or what is
    wrong."""
    if rx.closed:
        freed = rx.area_done is None and (rx.area.closed or rx.provider.__class__.__name__
                                           != "SoftProvider")
        return "closed-freed" if freed and rx.stats.in_flight == 0 else (
            f"closed, area {'handed back' if rx.area_done is None else 'kept'}, "
            f"in_flight {rx.stats.in_flight}")
    rx.flush()
    st, buf = rx.stats, rx.provider.group.buf
    if st.delivered_bytes != total or st.in_flight:
        return f"delivered {st.delivered_bytes} of {total}, in_flight {st.in_flight}"
    if buf.in_ring != buf.entries:
        return f"in_ring {buf.in_ring} of {buf.entries}"
    return "consistent"


# --- fields ----------------------------------------------------------------------------------

@case({"set": ["AttributeError"], "del": ["AttributeError"], "after": "consistent"})
def fields_read_only() -> dict[str, Any]:
    """Every public field of a Chunk, a CoalescedChunk and a Batch refuses a new value."""
    from zcnet.rx.zc import open_receiver

    (c1, s1), (c2, s2) = tcp_pair(), tcp_pair()
    rx = open_receiver(s1, "soft", **SMALL)
    rxc = open_receiver(s2, "soft", coalesce=True, **SMALL)
    c1.sendall(b"a" * FIRST)
    c2.sendall(b"b" * FIRST)
    time.sleep(0.05)
    chunks, batch, merged = rx.recv(5), None, rxc.recv(5)
    c1.sendall(b"a" * SECOND)
    time.sleep(0.05)
    batch = rx.recv_batch(5)
    coalesced = next(ch for ch in merged if ch.parts > 1)
    targets = [(chunks[0], f) for f in ("offset", "length", "stream_offset")]
    targets += [(coalesced, f) for f in ("parts", "length")]
    targets += [(batch, f) for f in ("offsets", "lengths", "length", "stream_offset")]
    set_ = {outcome_of(lambda o=obj, f=field: setattr(o, f, Evil(rx.close)))
            for obj, field in targets}
    del_ = {outcome_of(lambda o=obj, f=field: delattr(o, f)) for obj, field in targets}
    c1.sendall(b"a" * LAST)
    c1.shutdown(socket.SHUT_WR)
    receive_all(rx, [*chunks, batch])
    for ch in merged:
        ch.release()
    after = state_after(rx, FIRST + SECOND + LAST)
    rx.close()
    rxc.close()
    return {"set": sorted(set_), "del": sorted(del_), "after": after}


@case({"Chunk": "TypeError", "received class": "TypeError", "__index__": "not called"})
def handmade_chunk_odd_length() -> dict[str, str]:
    """A chunk built by hand (the public Chunk, or the class the receiver hands out) with a
    length whose ``__index__`` closes the receiver, released to it: the next receive raises
    TypeError, as the Python flush's sum does; the C flush never calls ``__index__``."""
    from zcnet.rx.zc import Chunk, open_receiver

    out = {}
    for name in ("Chunk", "received class"):
        c, s = tcp_pair()
        with open_receiver(s, "soft", **SMALL) as rx:
            c.sendall(b"x" * FIRST)
            got = rx.recv(5)
            cls = Chunk if name == "Chunk" else type(got[0])
            cls(rx.core, 0, Evil(rx.close), 0, 0).release()  # type: ignore[arg-type]
            out[name] = outcome_of(lambda rx=rx: rx.recv(0.1))
        c.close()
    out["__index__"] = "called" if Evil.called else "not called"
    return out


@case({"released": "TypeError", "delivered": "TypeError", "sends": "TypeError",
       "__index__": "not called"})
def stats_counter_odd() -> dict[str, str]:
    """zcnet.aio: a receiver's counter (and a copy sender's) replaced with an object whose
    ``__index__`` closes the receiver; the next receive (send) raises TypeError on both passes
    (the compiled round and send read ints only, the Python ones' arithmetic refuses it)."""
    from zcnet import aio

    async def main() -> dict[str, str]:
        out = {}
        for field in ("released", "delivered"):
            c, s = await pair()
            rx = aio.open_receiver(s, own_socket=True, **SMALL)
            c.send(b"x" * 100)
            (await asyncio.wait_for(rx.__anext__(), 5)).release()
            was = getattr(rx.stats, field)
            setattr(rx.stats, field, Evil(rx.close))
            c.send(b"y" * 100)
            await asyncio.sleep(0.02)
            try:
                await asyncio.wait_for(rx.recv(), 1)
                out[field] = "ok"
            except Exception as e:
                out[field] = kind(e)
            setattr(rx.stats, field, was)  # close() does its own arithmetic on them
            rx.close()
            c.close()
        c, s = await pair()
        async with aio.open_sender(s, "copy") as tx:
            tx._stats.sends = Evil(lambda: None)  # any call would count as made
            try:
                await asyncio.wait_for(tx.sendall(b"z" * 100), 1)
                out["sends"] = "ok"
            except Exception as e:
                out["sends"] = kind(e)
            tx._stats.sends = 0
        c.close()
        s.close()
        out["__index__"] = "called" if Evil.called else "not called"
        return out

    return asyncio.run(main())


# --- re-entry from a finalizer -----------------------------------------------------------------

def sync_reentry(call: str, action: str) -> Callable[[], list[str]]:
    """A sweep of the collector across ``call`` (recv, recv_batch, next, flush or close) of a
    blocking receiver, with a finalizer that does ``action`` on it."""
    def run() -> list[str]:
        return sorted({o for slack in SLACKS if (o := sync_once(call, action, slack))})
    return run


def sync_once(call: str, action: str, slack: int) -> str | None:
    from zcnet.rx.zc import open_receiver

    c, s = tcp_pair()
    rx = open_receiver(s, "soft", **SMALL)
    it = iter(rx)
    c.sendall(b"a" * FIRST)
    held = list(rx.recv(5))
    c.sendall(b"b" * SECOND)
    time.sleep(0.01)
    for h in held[:3]:
        h.release()
    del held[:3]
    fin: list[str] = []
    actions: dict[str, Callable[[], Any]] = {
        "recv": lambda: held.extend(rx.recv(0)),
        "next": lambda: held.append(next(it)),
        "flush": rx.flush,
        "release": lambda: held.pop().release(),
        "close": rx.close,
    }
    calls: dict[str, Callable[[], Any]] = {
        "recv": lambda: held.extend(rx.recv(5)),
        "recv_batch": lambda: held.append(rx.recv_batch(5)),
        "next": lambda: held.append(next(it)),
        "flush": rx.flush,
        "close": rx.close,
    }
    outer = fire(actions[action], calls[call], slack, fin)
    result = None
    if outer is not None:
        c.sendall(b"c" * LAST)
        c.shutdown(socket.SHUT_WR)
        if not rx.closed:
            held.extend(it)  # the round the iterator holds, and the rest of the stream
            receive_all(rx, held)
        else:
            for h in held:
                if h is not None and h._rx is not None:
                    h.release()
            del it  # its finalizer releases the rest of its round
        after = state_after(rx, FIRST + SECOND + LAST)
        result = f"outer={outer} fin={fin[0] if fin else 'ok'} after={after}"
    rx.close()
    c.close()
    return result


def fire(action: Callable[[], Any], call: Callable[[], Any], slack: int,
         fin: list[str]) -> str | None:
    """Run ``call`` with a finalizer armed to do ``action`` at the slack-th allocation: what
    ``call`` raised ("ok": nothing), or None when the collector did not run inside it."""
    armed = [False]
    Bomb.fired = False
    Bomb(lambda: fin.append(outcome_of(action)), armed)
    collect_at_next_allocation(slack)
    armed[0] = True
    try:
        outer = outcome_of(call)
    finally:
        armed[0] = False
        restore_collector()
    gc.collect()  # the Bomb left behind by an unarmed pass
    return outer if Bomb.fired else None


REFUSED_RECV = ["outer=ok fin=UsageError after=consistent"]
CLEAN = ["outer=ok fin=ok after=consistent"]
CLOSED = ["outer=ok fin=ok after=closed-freed"]
#: inside close, before it marks the receiver closed the action runs as it would outside
ALSO_BEFORE_CLOSE = ["outer=ok fin=ClosedError after=closed-freed", *CLOSED]
SYNC_REENTRY = {
    ("recv", "recv"): REFUSED_RECV, ("recv", "next"): REFUSED_RECV, ("recv", "flush"): CLEAN,
    ("recv", "release"): CLEAN, ("recv", "close"): CLOSED,
    ("recv_batch", "recv"): REFUSED_RECV, ("recv_batch", "flush"): CLEAN,
    ("recv_batch", "release"): CLEAN, ("recv_batch", "close"): CLOSED,
    ("next", "recv"): REFUSED_RECV, ("next", "next"): ["outer=ok fin=ValueError after=consistent"],
    ("next", "flush"): CLEAN, ("next", "release"): CLEAN, ("next", "close"): CLOSED,
    ("flush", "recv"): REFUSED_RECV, ("flush", "release"): CLEAN, ("flush", "close"): CLOSED,
    ("close", "release"): CLOSED, ("close", "close"): CLOSED,
    ("close", "flush"): ALSO_BEFORE_CLOSE, ("close", "recv"): ALSO_BEFORE_CLOSE,
}
#: what each finalizer action may raise, whatever call it lands in
RECV_INSIDE = ("UsageError: recv() inside another receive or flush of this receiver (a finalizer "
               "or a signal handler ran there) (fix: only release chunks from __del__ and "
               "signal handlers; receive in the code that owns the receiver)")
SYNC_MESSAGES = {
    "recv": frozenset({RECV_INSIDE, closed("recv() on a closed Receiver")}),
    "next": frozenset({RECV_INSIDE, "ValueError: generator already executing"}),
    "flush": frozenset({closed("flush() on a closed Receiver")}),
    "release": frozenset(), "close": frozenset(),
}
for (_call, _action), _expected in SYNC_REENTRY.items():
    CASES[f"reentry-{_call}-{_action}"] = Case(sync_reentry(_call, _action), _expected,
                                               SYNC_MESSAGES[_action])


def aio_reentry(call: str, action: str) -> Callable[[], list[str]]:
    """The sweep of sync_reentry for a zcnet.aio receiver on the loop's shared ring (the
    compiled round, or the Python one): ``call`` is anext, recv or recv_batch."""
    def run() -> list[str]:
        from zcnet import aio

        async def one(slack: int) -> str | None:
            c, s = await pair()
            rx = aio.open_receiver(s, own_socket=True, **SMALL)
            c.setblocking(True)
            c.sendall(b"a" * FIRST)
            held = list(await asyncio.wait_for(rx.recv(), 5))
            c.sendall(b"b" * SECOND)
            await asyncio.sleep(0.01)
            for h in held[:3]:
                h.release()
            del held[:3]
            fin: list[str] = []
            actions: dict[str, Callable[[], Any]] = {
                "flush": rx.flush,
                "release": lambda: held.pop().release(),
                "close": rx.close,
            }
            steps: dict[str, Callable[[], Awaitable[Any]]] = {
                "anext": rx.__anext__, "recv": rx.recv, "recv_batch": rx.recv_batch}
            got: list[Any] = []
            outer = await afire(actions[action], steps[call], slack, fin, got)
            res = got[0] if got else None
            held.extend(res if isinstance(res, list) else [res])
            result = None
            if outer is not None:
                for h in held:
                    if h is not None and h._rx is not None:
                        h.release()
                if not rx.closed:  # (a closed one closed its socket: the peer is reset)
                    c.sendall(b"c" * LAST)
                    c.shutdown(socket.SHUT_WR)
                    async for h in rx:
                        h.release()
                after = state_after(rx.rx, FIRST + SECOND + LAST)
                result = f"outer={outer} fin={fin[0] if fin else 'ok'} after={after}"
            rx.close()
            c.close()
            return result

        async def main() -> list[str]:
            seen = set()
            for slack in SLACKS:
                r = await one(slack)
                if r is not None:
                    seen.add(r)
            return sorted(seen)

        return asyncio.run(main())
    return run


async def afire(action: Callable[[], Any], step: Callable[[], Awaitable[Any]], slack: int,
                fin: list[str], got: list[Any]) -> str | None:
    """fire() for one awaited receive (not through wait_for: its task would run the
    collector first)."""
    me = asyncio.current_task()
    assert me is not None
    timer = asyncio.get_running_loop().call_later(5, me.cancel)
    armed = [False]
    Bomb.fired = False
    Bomb(lambda: fin.append(outcome_of(action)), armed)
    aw = step()
    collect_at_next_allocation(slack)
    armed[0] = True
    err: BaseException | None = None
    try:
        got.append(await aw)
    except Exception as e:
        err = e
    except asyncio.CancelledError:
        err = TimeoutError("the receive waited for 5 s")
    finally:
        armed[0] = False
        restore_collector()
        timer.cancel()
    gc.collect()
    return kind(err) if Bomb.fired else None


#: a zcnet.aio receive's own words for a receiver closed before or during it (never those of
#: the blocking Receiver inside)
AIO_CLOSED = frozenset({closed("receive on a closed zcnet.aio receiver"),
                        closed("the zcnet.aio receiver was closed while a receive waited")})
for _call in ("anext", "recv", "recv_batch"):
    CASES[f"aio-reentry-{_call}-flush"] = Case(aio_reentry(_call, "flush"), CLEAN, frozenset())
    CASES[f"aio-reentry-{_call}-release"] = Case(aio_reentry(_call, "release"), CLEAN,
                                                 frozenset())
    CASES[f"aio-reentry-{_call}-close"] = Case(
        aio_reentry(_call, "close"),
        ["outer=ClosedError fin=ok after=closed-freed", "outer=ok fin=ok after=closed-freed"],
        AIO_CLOSED)


# --- abandoned awaitables ----------------------------------------------------------------------

def abandoned(loop: str) -> Callable[[], dict[str, str]]:
    """For each receiver kind and receive awaitable: step it once (it waits: no data yet),
    then close it, throw into it or drop it; the next receive must get the data. And a
    sender's ``acquire`` abandoned the same way while every slot is held."""
    def run() -> dict[str, str]:
        from zcnet import aio

        kinds = {"shared": dict(SMALL), "pool": {"pool": True},
                 "own": {"shared_ring": False, **SMALL}}

        async def receive_after(rx: Any, which: str, c: socket.socket) -> str:
            aw = {"anext": rx.__anext__, "recv": rx.recv, "recv_batch": rx.recv_batch}[which]
            for how in ("close", "throw", "drop"):
                step = aw()
                step.send(None)  # it waits: nothing has arrived
                abandon(step, how)
                del step
                gc.collect()
                c.send(b"z" * 100)
                try:
                    got = await with_timeout(loop, aw(), 5)
                except Exception as e:
                    return f"{how}: {kind(e)}"
                for h in got if isinstance(got, list) else [got]:
                    h.release()
            return "ok"

        async def main() -> dict[str, str]:
            out = {}
            for k, kw in kinds.items():
                for which in ("anext", "recv", "recv_batch"):
                    c, s = sync_pair_nonblocking()
                    rx = aio.open_receiver(s, own_socket=True, **kw)
                    out[f"{k} {which}"] = await receive_after(rx, which, c)
                    rx.close()
                    c.close()
            out["sender acquire"] = await acquire_after(aio)
            return out

        return run_on(loop, main)
    return run


async def acquire_after(aio: Any) -> str:
    """A sender with one slot, held: acquire() abandoned three ways, then a send frees the
    slot and acquire() gets it."""
    c, s = sync_pair_nonblocking()
    try:
        async with aio.open_sender(s, "copy", slots=1, slot_size=4096) as tx:
            slot = await tx.acquire()
            for how in ("close", "throw", "drop"):
                step = tx.acquire()
                step.send(None)  # it waits: the one slot is held
                abandon(step, how)
                del step
                gc.collect()
            slot.view[:3] = b"abc"
            await tx.send(slot, 3)
            slot = await with_timeout_any(tx.acquire(), 5)
            return "ok" if slot is not None else "no slot"
    except Exception as e:
        return kind(e)
    finally:
        c.close()


def sync_pair_nonblocking() -> tuple[socket.socket, socket.socket]:
    c, s = tcp_pair()
    s.setblocking(False)
    return c, s


async def with_timeout(loop: str, aw: Awaitable[Any], seconds: float) -> Any:
    if loop == "trio":
        import trio

        with trio.fail_after(seconds):
            return await aw
    return await asyncio.wait_for(aw, seconds)


async def with_timeout_any(aw: Awaitable[Any], seconds: float) -> Any:
    import sniffio

    return await with_timeout("trio" if sniffio.current_async_library() == "trio" else "",
                              aw, seconds)


def run_on(loop: str, main: Callable[[], Awaitable[Any]]) -> Any:
    if loop == "trio":
        import trio

        return trio.run(main)
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main())  # type: ignore[arg-type]
    return asyncio.run(main())  # type: ignore[arg-type]


for _loop in ("asyncio", "uvloop", "trio"):
    CASES[f"abandoned-{_loop}"] = Case(abandoned(_loop), None)  # expected: all "ok", below


# --- a ring closed under another thread ------------------------------------------------------

@case(["ClosedError"], frozenset(closed(f"{m}() on a closed Ring")
                                  for m in ("prep", "prep_batch", "submit", "reap", "reap_one")))
def ring_closed_under_use() -> list[str]:
    """A thread preps, submits (waiting, and with a timeout) and reaps in a loop while another
    closes the ring at a random moment: it gets ClosedError, never another error."""
    import random

    import numpy as np

    from zcnet.uapi import io_uring as u
    from zcnet.uring.ring import Ring

    sys.setswitchinterval(1e-6)
    ud = np.arange(4, dtype=np.uint64)
    seen: set[str] = set()
    for i in range(300):
        r = Ring(8)

        def use(r: Ring = r, i: int = i) -> None:
            try:
                while True:
                    r.prep(u.IORING_OP_NOP, user_data=1)
                    r.prep_batch(u.IORING_OP_NOP, ud)
                    r.submit(5) if i % 3 else r.submit(5, 0.001)
                    r.reap(2)
                    r.reap_one()
                    r.reap()
            except Exception as e:
                seen.add(kind(e))

        t = threading.Thread(target=use)
        t.start()
        time.sleep(random.random() * 0.002)
        r.close()
        t.join(10)
        if t.is_alive():
            return ["hang"]
    return sorted(seen)


@case({"during": "anon_inode:[io_uring]", "thread": "ClosedError", "after": "closed"})
def ring_fd_outlives_its_enter() -> dict[str, str]:
    """Closed while another thread waits in io_uring_enter: the fd stays this ring's until
    that enter returns (a number closed earlier could name another file when the kernel reads
    it), the waiter gets ClosedError, and the fd is closed then."""
    from zcnet.uapi import io_uring as u
    from zcnet.uring.ring import Ring

    r = Ring(8)
    fd = r.fd
    # A TIMEOUT of 0.3 s (struct __kernel_timespec): the enter waiting for one completion
    # returns when it fires.
    ts = (ctypes.c_int64 * 2)(0, 300_000_000)
    r.prep(u.IORING_OP_TIMEOUT, addr=ctypes.addressof(ts), length=1, user_data=9)
    out: dict[str, str] = {}

    t = threading.Thread(target=lambda: out.update(thread=outcome_of(lambda: r.submit(1))))
    t.start()
    time.sleep(0.1)  # it waits in the kernel now
    r.close()
    out["during"] = os.readlink(f"/proc/self/fd/{fd}")
    t.join(5)
    try:
        os.fstat(fd)
        out["after"] = "open: " + os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        out["after"] = "closed"
    return out


def main() -> None:
    name = sys.argv[1]
    outcome = CASES[name].run()
    print("OUTCOME " + json.dumps({"outcome": outcome, "messages": sorted(MESSAGES)},
                                  sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
