"""The compiled modules read CQEs through one header (src/zcnet/_cqe.h) and write provided-buffer
rings through another (src/zcnet/_bufring.h); the layouts they were built with are the kernel's
structs as zcnet.uapi spells them (the one place for the ABI)."""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

import pytest

from zcnet.uapi import io_uring as u

READ_CQES = ("zcnet.uring._accel", "zcnet.rx.zc._rxaccel", "zcnet.aio._loopaccel")
WRITE_BUFRINGS = ("zcnet.uring._accel", "zcnet.aio._loopaccel")  # rx's core writes none


def _built(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        pytest.skip(f"{name} is not built (no C compiler at install)")


@pytest.fixture(params=READ_CQES)
def compiled(request: pytest.FixtureRequest) -> Any:
    return _built(request.param)


@pytest.fixture(params=WRITE_BUFRINGS)
def bufring_writer(request: pytest.FixtureRequest) -> Any:
    return _built(request.param)


def test_compiled_cqe_layout_is_the_uapi_one(compiled: Any) -> None:
    cqe = u.io_uring_cqe
    assert compiled.cqe_layout() == {
        "user_data": cqe.user_data.offset, "res": cqe.res.offset, "flags": cqe.flags.offset,
        "size": ctypes.sizeof(cqe), "size_cqe32": 2 * ctypes.sizeof(cqe),
    }


def test_compiled_buffer_ring_layout_is_the_uapi_one(bufring_writer: Any) -> None:
    """The tail is entry 0's resv."""
    buf = u.io_uring_buf
    assert bufring_writer.bufring_layout() == {
        "addr": buf.addr.offset, "len": buf.len.offset, "bid": buf.bid.offset,
        "resv": buf.resv.offset, "size": ctypes.sizeof(buf),
    }
