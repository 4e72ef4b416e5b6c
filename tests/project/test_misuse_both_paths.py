"""Misuse on both paths (tests/misuse_cases.py): each case runs once on the pure path
(ZCNET_PURE=1) and once on the compiled one, each in an interpreter of its own so that a crash
or a hang fails the case, and both must end as the case expects (the same exception types, or
none, and a receiver left in step) with the same messages (or, for a sweep or a race, messages
the case allows). Every case crashed, hung or diverged before its fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import zcnet
from misuse_cases import CASES
from paths import TESTS
from zcnet.aio import shared
from zcnet.uring.syscall import accel_available

HERE = TESTS
SRC = str(Path(zcnet.__file__).resolve().parents[1])


def _run(name: str, path: str) -> subprocess.CompletedProcess[str] | None:
    """The case's interpreter run; None when it hung."""
    env = {**os.environ, "ZCNET_PURE": "1" if path == "pure" else "0",
           "PYTHONPATH": os.pathsep.join((SRC, str(HERE)))}
    try:
        return subprocess.run([sys.executable, str(HERE / "misuse_cases.py"), name], env=env,
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return None


_STARTED: dict[tuple[str, str], Future[subprocess.CompletedProcess[str] | None]] = {}


@pytest.fixture(scope="module", autouse=True)
def _run_selected_cases_side_by_side(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each case is an interpreter of its own that mostly waits on itself: the selected ones
    start at once, as many at a time as there are CPUs, and each test takes its result."""
    wanted = {(item.callspec.params["name"], path)
              for item in request.session.items
              if getattr(item, "module", None) is request.module and hasattr(item, "callspec")
              for path in ([item.callspec.params["path"]] if "path" in item.callspec.params
                           else ["pure", "c"])}
    with ThreadPoolExecutor(max(2, os.cpu_count() or 1)) as pool:
        for key in sorted(wanted):
            _STARTED[key] = pool.submit(_run, *key)
        yield
        for f in _STARTED.values():
            f.cancel()
        _STARTED.clear()


@cache
def _outcome(name: str, path: str) -> dict[str, Any]:
    if path == "c" and not (accel_available() and shared._loopaccel is not None):
        pytest.skip("the compiled accelerators are not built: install with a C compiler")
    started = _STARTED.get((name, path))
    p = started.result() if started is not None else _run(name, path)
    if p is None:
        pytest.fail(f"{name} on the {path} path hung")
    if p.returncode < 0:
        pytest.fail(f"{name} on the {path} path: the interpreter died of "
                    f"{signal.Signals(-p.returncode).name}\n{p.stderr[-3000:]}")
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("OUTCOME ")),
                None)
    assert p.returncode == 0 and line, p.stderr[-3000:]
    return json.loads(line.removeprefix("OUTCOME "))  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", ["pure", "c"])
@pytest.mark.parametrize("name", list(CASES))
def test_misuse_ends_as_expected(name: str, path: str) -> None:
    got = _outcome(name, path)["outcome"]
    expected = CASES[name].expected
    if expected is None:  # abandoned-*: every awaitable's next receive worked
        assert isinstance(got, dict) and got and set(got.values()) == {"ok"}, got
    elif isinstance(expected, list) and name.startswith(("reentry-", "aio-reentry-")):
        # A sweep: the outcomes of the passes that fired, each one the case allows (where a
        # finalizer lands decides between them, and the two paths allocate differently).
        assert got and set(got) <= set(expected), got
    else:
        assert got == expected


@pytest.mark.parametrize("name", list(CASES))
def test_misuse_raises_the_same_messages_on_both_paths(name: str) -> None:
    pure, compiled = (_outcome(name, path)["messages"] for path in ("pure", "c"))
    allowed = CASES[name].messages
    if allowed is None:
        assert pure == compiled
    else:  # a sweep or a race: each path raises what the case allows, nothing else
        assert set(pure) <= allowed, set(pure) - allowed
        assert set(compiled) <= allowed, set(compiled) - allowed
