"""Every public receive operation and misuse (tests/rx_ops_cases.py) on both paths: the pure
one (ZCNET_PURE=1) and the compiled one, each in an interpreter of its own. The two must give
the same result, or the same exception type with the same message; and each misuse must raise
what the table says (so two paths that both forgot a check do not pass)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import zcnet
from paths import TESTS
from rx_ops_cases import CASES
from zcnet.aio import shared
from zcnet.rx.zc.accel import rx_accel_for
from zcnet.uring.syscall import accel_available

HERE = TESTS
SRC = str(Path(zcnet.__file__).resolve().parents[1])

#: The misuse cases and the exception each must raise (on both paths).
RAISES = {
    "release-twice": "ValueError", "release-many-twice-in-one-call": "ValueError",
    "release-to-another-receiver": "ValueError", "data-of-a-released-chunk": "ValueError",
    "negative-timeout": "UsageError", "nan-timeout": "UsageError",
    "max-held-out-of-range": "UsageError", "recv-after-close": "ClosedError",
    "flush-after-close": "ClosedError", "recv-from-another-thread": "ZcnetError",
    "aio-release-twice": "ValueError", "aio-recv-after-close": "ClosedError",
}


@cache
def outcomes(path: str) -> dict[str, list[object]]:
    env = {**os.environ, "ZCNET_PURE": "1" if path == "pure" else "0",
           "PYTHONPATH": os.pathsep.join((SRC, str(HERE)))}
    p = subprocess.run([sys.executable, str(HERE / "rx_ops_cases.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("OUTCOMES ")),
                None)
    assert p.returncode == 0 and line, p.stderr[-3000:]
    return json.loads(line.removeprefix("OUTCOMES "))  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", list(CASES))
def test_both_paths_give_the_same_outcome(name: str) -> None:
    if not (accel_available() and rx_accel_for("c") is not None
            and shared.loop_accel() is not None):
        pytest.skip("the compiled accelerators are not built: install with a C compiler")
    pure, compiled = outcomes("pure")[name], outcomes("c")[name]
    assert pure == compiled
    assert pure[0] == RAISES.get(name, "ok"), pure
