"""The compiled halves read CQEs through one header (src/zcnet/_cqe.h); the layout it was built
with is the kernel's struct io_uring_cqe as zcnet.uapi spells it (the one place for the ABI)."""

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
