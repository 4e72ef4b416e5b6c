"""The compiled accelerators (zcnet.uring._accel, the ring's; zcnet.rx.zc._rxaccel, the receive
core's) check what they are given before they touch memory:
sizes and counts whose products would wrap, a CQE size that only fits once narrowed, a refill
ring region past its mapping, a typeless buffer, lists a finalizer empties during the call, a
CQ head out of step, and a ring Core with no ring.
Each is refused (an error, or None: "not for the compiled path") instead of reading or writing
out of bounds. Every case runs in its own interpreter, so a regression is a failed test, not a
crashed suite."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("zcnet.uring._accel") is None
    or importlib.util.find_spec("zcnet.rx.zc._rxaccel") is None,
    reason="the compiled accelerators are not built (no C compiler)")

PRELUDE = "import struct, numpy as np, zcnet.uring._accel as a, zcnet.rx.zc._rxaccel as x\n"
UD, MORE, BUF, SHIFT = 7, 2, 1, 16

# zcnet.rx.zc.core binds the chunk class make_chunks makes (at import).
BOUND = "import zcnet.rx.zc.core\n"


def _lists_changed(finalizer: str, n: int = 8) -> str:
    """make_chunks over ``n`` items while a GC pass inside it runs ``finalizer`` on the
    lists (offs, lens, toks); prints the RuntimeError it must raise."""
    return (f"import gc\n{BOUND}"
            f"offs, lens, toks = list(range({n})), [10] * {n}, list(range({n}))\n"
            "class Bomb:\n"
            "    def __del__(self):\n"
            f"        {finalizer}\n"
            "b = Bomb(); b.me = b; del b\n"
            "gc.set_threshold(1)\n"
            "try:\n"
            "    x.make_chunks(None, offs, lens, toks, 0)\n"
            "except RuntimeError as e:\n"
            "    print(e)")


CASES = {
    # 2**61 two-byte elements of one value (stride 0): 2**61 * 8 bytes of ints would wrap.
    "int list that cannot be allocated": (
        "print(x.int_sum(np.broadcast_to(np.uint16(1), (2**61,))))", "None"),
    # n * 32 wraps to 0: the 64 bytes given do not hold 2**61 CQEs.
    "more CQEs than the bytes hold": (
        f"c = struct.pack('<QiI', {UD}, 100, {MORE}) + bytes(16)\n"
        f"r = x.zcrx_round(c * 2, 2**61, {UD}, {MORE}, (1 << 48) - 1)\n"
        # records written into b"" would overwrite the interpreter's one-byte bytes objects
        "print(r, b''.join(bytes([i]) for i in range(256)) == bytes(range(256)))",
        "None True"),
    # 2**62 + 16 is 16 once narrowed to 32 bits.
    "CQE size that fits only when narrowed": (
        f"raw = struct.pack('<QiI', {UD}, 10, {MORE | BUF}) * 4\n"
        "try:\n"
        f"    x.soft_round(raw, 4, 2**62 + 16, {UD}, {MORE}, {BUF}, {SHIFT}, bytearray(64), 4,"
        " 0, 4096, 0)\n"
        "except ValueError as e:\n"
        "    print(e)", "soft_round: a CQE is 16 or 32 bytes"),
    # 2**60 entries of 16 bytes wrap to 0 bytes.
    "refill ring larger than its region": (
        "try:\n"
        "    x.refill_push(bytearray(64), 0, 4, 8, 2**60, 2**40, [0], [1], 0, 0)\n"
        "except ValueError as e:\n"
        "    print(e)", "the refill ring does not fit in its region"),
    "refill index past the region's end": (
        "try:\n"
        "    x.refill_push(bytearray(64), 2**64 - 2, 4, 8, 2, 0, [0], [1], 0, 0)\n"
        "except ValueError as e:\n"
        "    print(e)", "the refill ring does not fit in its region"),
    "misaligned refill index": (
        "try:\n"
        "    x.refill_push(bytearray(64), 2, 4, 8, 2, 0, [0], [1], 0, 0)\n"
        "except ValueError as e:\n"
        "    print(e)", "the refill ring does not fit in its region"),
    # A GC pass inside the call runs a finalizer that empties the lists being read, or cuts
    # one of two items off (the next index is then just past its end).
    "lists emptied by a finalizer mid-call": (
        _lists_changed("offs.clear(); lens.clear(); toks.clear()"),
        "make_chunks: the lists changed during the call"),
    **{f"{name} shortened by a finalizer mid-call": (
        _lists_changed(f"del {name}[1:]", 2), "make_chunks: the lists changed during the call")
       for name in ("offs", "lens", "toks")},
    # A length that is not an int (the C never calls __index__), a class without the slots.
    "chunk length that is not an int": (
        BOUND +
        "class L:\n"
        "    def __index__(self):\n"
        "        print('__index__ called')\n"
        "        return 1\n"
        "try:\n"
        "    x.make_chunks(None, [0], [L()], [0], 0)\n"
        "except TypeError as e:\n"
        "    print(e)", "make_chunks: a length is L, not an int"),
    # The chunk slots are handed over as descriptors: one the class does not have (it is no
    # Chunk), or one a subclass shadows with a property, would be read where the class keeps
    # something else.
    "chunk class without a slot": (
        "from collections import deque\n"
        "from zcnet.rx.zc.chunks import CHUNK_SLOTS, Held\n"
        "from zcnet.rx.zc.core import RxCore\n"
        "class C(Held):\n"
        "    __slots__ = ()\n"
        "try:\n"
        "    x.bind(Held, C, CHUNK_SLOTS, RxCore, deque, Held.release)\n"
        "except TypeError as e:\n"
        "    print(e)", "<member '_offset' of 'Chunk' objects> is not a writable __slots__ member "
        "of C"),
    "chunk class that shadows a slot": (
        "from collections import deque\n"
        "from zcnet.rx.zc.chunks import CHUNK_SLOTS, Chunk, Held\n"
        "from zcnet.rx.zc.core import RxCore\n"
        "class C(Chunk):\n"
        "    __slots__ = ()\n"
        "    _length = property(lambda self: 0)\n"
        "try:\n"
        "    x.bind(Held, C, CHUNK_SLOTS, RxCore, deque, Held.release)\n"
        "except TypeError as e:\n"
        "    print(e)", "<member '_length' of 'Held' objects> is not a writable __slots__ member "
        "of C"),
    # A buffer id equal to the ring size names no buffer: nothing is written (the Python path
    # raises), and the tail stays.
    "buffer id past the ring": (
        "mem = bytearray(4 * 16)\n"
        "print(a.buf_provide(mem, 4, 0, [1, 4], 1 << 20, 4096), mem == bytearray(64))",
        "None True"),
    # soft_round's last CQE: EOF (res 0) ends the round with no record; one that also names
    # a buffer, or an errno that does, is not the common round (None: the Python path).
    "soft round ending at EOF": (
        f"c = struct.pack('<QiI', {UD}, 10, {MORE | BUF}) + struct.pack('<QiI', {UD}, 0, 0)\n"
        "mem = bytearray(4 * 16)\n"
        "struct.pack_into('<H', mem, 16 + 12, 1)\n"
        f"r = x.soft_round(c, 2, 16, {UD}, {MORE}, {BUF}, {SHIFT}, mem, 4, 0, 4096, 0)\n"
        "print(r[1], r[2])", "1 0"),
    "soft round ending with a buffer and no data": (
        f"c = struct.pack('<QiI', {UD}, 0, {BUF})\n"
        f"print(x.soft_round(c, 1, 16, {UD}, {MORE}, {BUF}, {SHIFT}, bytearray(64), 4, 0, 4096,"
        " 0))", "None"),
    "soft round with an empty buffer in the middle": (
        f"c = struct.pack('<QiI', {UD}, 0, {MORE | BUF}) * 2\n"
        f"print(x.soft_round(c, 2, 16, {UD}, {MORE}, {BUF}, {SHIFT}, bytearray(64), 4, 0, 4096,"
        " 0))", "None"),
    # The ring's Core: a CQ head moved 100000 back (a second reaper out of step, or a write
    # through Ring.cq_addresses) makes tail - head larger than the ring; no copy past it.
    "CQ head out of step with the tail": (
        "import ctypes\n"
        "from zcnet.uring.ring import Ring\n"
        "r = Ring(8)\n"
        "h = ctypes.c_uint32.from_address(r.cq_addresses().cq_head)\n"
        "h.value = (h.value - 100000) & 0xFFFFFFFF\n"
        "print(r.backend, len(r.reap()) >= 0)", "c True"),
    # A Core made without __init__, or whose __init__ failed on a closed ring, has no ring.
    "Core never initialised": (
        "try:\n"
        "    a.Core.__new__(a.Core).reap_one()\n"
        "except ValueError as e:\n"
        "    print(e)", "reap_one() on a Core that was never bound to a ring"),
    "Core whose second __init__ failed": (
        "from zcnet.uring.ring import Ring\n"
        "r = Ring(8); core = r._core; r.close()\n"
        "try:\n"
        "    core.__init__(r, Exception, 'not a type', (), 0, 3, 0, 0, 0, 0, 0, 0, 0, 7, 8, 64,"
        " 0, 15, 16, 0)\n"
        "except TypeError:\n"
        "    pass\n"
        "try:\n"
        "    core.reap_one()\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)", "ClosedError"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_input_is_refused_not_followed(case: str) -> None:
    code, expected = CASES[case]
    p = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True,
                       timeout=60)
    assert (p.returncode, p.stdout.strip()) == (0, expected), p.stderr[-2000:]


def test_the_same_calls_still_work_when_their_input_fits() -> None:
    """The checks refuse only what does not fit: sums and a refill push that fit still work."""
    import numpy as np

    import zcnet.rx.zc._rxaccel as x

    assert x.int_sum(np.arange(10, dtype=np.uint16)) == 45
    assert x.int_sum(np.broadcast_to(np.uint16(3), (1000,))) == 3000
    mem = bytearray(8 + 2 * 16)  # head at 0, tail at 4, two entries from 8
    assert x.refill_push(mem, 0, 4, 8, 2, 0, [4096], [100], 0, (1 << 48) - 1) == 1
    assert int.from_bytes(mem[4:8], "little") == 1
    assert int.from_bytes(mem[8:16], "little") == 4096
    assert int.from_bytes(mem[16:20], "little") == 100
