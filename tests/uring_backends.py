"""Run a test module on both ring hot paths: the compiled accelerator ("c") and pure Python.

Import ``ring_backend`` into a test module: it is an autouse fixture, so every test there runs
once per backend (the choice is read when a Ring is made, from ZCNET_PURE). "c" skips, with the
reason, when the accelerator is not built (no C compiler at install time).
"""

from __future__ import annotations

import pytest

from zcnet.uring.syscall import accel_available


@pytest.fixture(params=["c", "pure"], autouse=True)
def ring_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "c" and not accel_available():
        pytest.skip("the compiled accelerator (zcnet.uring._accel) is not built: "
                    "install with a C compiler to test it")
    monkeypatch.setenv("ZCNET_PURE", "1" if request.param == "pure" else "0")
    return str(request.param)
