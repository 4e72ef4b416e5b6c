"""Ring and BufRing after close: every public method raises ClosedError, none touches the
unmapped memory (which would kill the interpreter, so each call runs in a subprocess)."""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap

import pytest

from uring_backends import ring_backend  # noqa: F401  (autouse: every test on both paths)
from zcnet.uring.bufring import BufRing
from zcnet.uring.ring import Ring

# Every public method or property, and a call of it with valid arguments.
RING_CALLS = {
    "__enter__": "o.__enter__()",
    "cq_addresses": "o.cq_addresses()",
    "cq_overflow": "o.cq_overflow",
    "cq_ready": "o.cq_ready()",
    "get_events": "o.get_events()",
    "pending": "o.pending",
    "prep": "o.prep(0, user_data=1)",
    "prep_batch": "o.prep_batch(0, np.arange(4, dtype=np.uint64))",
    "reap": "o.reap()",
    "reap_one": "o.reap_one()",
    "register": "o.register(u.IORING_REGISTER_PROBE, None, 0)",
    "sq_flags": "o.sq_flags",
    "sq_space": "o.sq_space()",
    "submit": "o.submit(1)",
    "wait": "o.wait(1, 0.01)",
}
BUFRING_CALLS = {
    "__enter__": "o.__enter__()",
    "buffer": "o.buffer(0)",
    "consumed": "o.consumed(4096, 0)",
    "consumed_ids": "o.consumed_ids(4096, 0)",
    "filled": "o.filled(10, 0, True)",
    "kernel_head": "o.kernel_head()",
    "took": "o.took(1)",
    "provide": "o.provide(np.array([0], dtype=np.uint16))",
    "provide_few": "o.provide_few([0])",
    "take": "o.take(np.array([0], dtype=np.uint16))",
    "take_round": "o.take_round(Completions.from_raw(bytearray(16), 1, False), 1, None)",
}
# Not uses of the object: closing again, and asking whether it is closed.
EXEMPT = {"close", "__exit__", "closed"}

SETUP = {
    "ring": "o = Ring(8)\no.prep(0)\no.close()",
    "bufring": "r = Ring(8)\no = BufRing(r, 1, 4, 4096)\no.close()",
    "bufring-ring-closed": "r = Ring(8)\no = BufRing(r, 1, 4, 4096)\nr.close()",
}


def public(cls: type) -> set[str]:
    names = {n for n, v in inspect.getmembers(cls)
             if not n.startswith("_") and not inspect.ismemberdescriptor(v)}  # slots: data
    return (names | {"__enter__", "__exit__"}) - EXEMPT


@pytest.mark.parametrize(("cls", "calls"), [(Ring, RING_CALLS), (BufRing, BUFRING_CALLS)])
def test_the_table_covers_every_public_method(cls: type, calls: dict[str, str]) -> None:
    assert public(cls) == set(calls), "add the new method to the table of calls after close"


PROGRAM = textwrap.dedent("""
    import numpy as np
    from zcnet.errors import ClosedError
    from zcnet.uapi import io_uring as u
    from zcnet.uring.bufring import BufRing
    from zcnet.uring.completions import Completions
    from zcnet.uring.ring import Ring
    {setup}
    try:
        {call}
    except ClosedError as e:
        assert isinstance(e, ValueError)
        print("closed:", e)
    else:
        print("no error")
    o.close()  # closing again is fine
    """)
CASES = ([("ring", name, call) for name, call in RING_CALLS.items()]
         + [(setup, name, call) for setup in ("bufring", "bufring-ring-closed")
            for name, call in BUFRING_CALLS.items()])


@pytest.mark.parametrize(("setup", "name", "call"), CASES,
                         ids=[f"{s}-{n}" for s, n, _ in CASES])
def test_use_after_close_raises_closed_error(setup: str, name: str, call: str) -> None:
    code = PROGRAM.format(setup=SETUP[setup], call=call)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"{name} after close: rc {p.returncode} {p.stderr[-500:]}"
    assert p.stdout.startswith("closed: "), f"{name} after close: {p.stdout} {p.stderr[-300:]}"
    assert "closed" in p.stdout[len("closed: "):]


def test_closing_twice_and_the_closed_flag(no_leaks) -> None:
    r = Ring(4)
    br = BufRing(r, 2, 4, 4096)
    assert not r.closed and not br.closed
    br.close()
    br.close()
    r.close()
    r.close()
    assert r.closed and br.closed


def test_completions_stay_readable_after_the_ring_closes(no_leaks) -> None:
    """Reaped CQEs are a copy, decoded lazily: decoding after close reads no ring memory."""
    r = Ring(4)
    r.prep(0, user_data=42)
    r.submit(1)
    c = r.reap()
    r.close()
    assert c.user_data.tolist() == [42] and c.res.tolist() == [0] and c.flags.tolist() == [0]
