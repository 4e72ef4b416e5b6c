"""The compiled halves read CQEs through one header (src/zcnet/_cqe.h) and write provided-buffer
rings through another (src/zcnet/_bufring.h); the layouts they were built with are the kernel's
structs as zcnet.uapi spells them (the one place for the ABI)."""

from __future__ import annotations

import ctypes
import importlib

import pytest

from zcnet.uapi import io_uring as u


@pytest.mark.parametrize("module", ["zcnet.uring._accel", "zcnet.aio._loopaccel"])
def test_compiled_cqe_layout_is_the_uapi_one(module: str) -> None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        pytest.skip(f"{module} is not built (no C compiler at install)")
    cqe = u.io_uring_cqe
    assert mod.cqe_layout() == {
        "user_data": cqe.user_data.offset, "res": cqe.res.offset, "flags": cqe.flags.offset,
        "size": ctypes.sizeof(cqe), "size_cqe32": 2 * ctypes.sizeof(cqe),
    }


@pytest.mark.parametrize("module", ["zcnet.uring._accel", "zcnet.aio._loopaccel"])
def test_compiled_buffer_ring_layout_is_the_uapi_one(module: str) -> None:
    """Both write provided-buffer ring entries through src/zcnet/_bufring.h; its layout is
    struct io_uring_buf's, the tail in entry 0's resv."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        pytest.skip(f"{module} is not built (no C compiler at install)")
    buf = u.io_uring_buf
    assert mod.bufring_layout() == {
        "addr": buf.addr.offset, "len": buf.len.offset, "bid": buf.bid.offset,
        "resv": buf.resv.offset, "size": ctypes.sizeof(buf),
    }
