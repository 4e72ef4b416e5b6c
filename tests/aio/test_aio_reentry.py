"""Python that runs inside the compiled pass (zcnet.aio._loopaccel) and the Python round: a GC
pass in an allocation, a finalizer of a released batch, a method the pass calls. Each case in
tests/reentry/ is a script (it moves the collector's thresholds and patches classes, so it gets
an interpreter of its own) ending with a verdict line; each one failed before its fix:

- flush_gc: the flush wrote the buffer ring from state read before its own GC point;
- double_arm: a round run from a finalizer re-armed, and the compiled round armed again;
- route_inbox: completions went to a member's inbox list that a nested round had replaced;
- wait_closed: a receiver closed while its wait's future was made was waited on forever.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paths import TESTS
from zcnet.aio import shared

CASES = TESTS / "reentry"


def _verdict(script: str, *args: str, pure: bool) -> str:
    if not pure and shared._loopaccel is None:
        pytest.skip("zcnet.aio._loopaccel is not built: install with a C compiler to test it")
    env = dict(os.environ, ZCNET_PURE="1" if pure else "0")
    p = subprocess.run([sys.executable, script, *args], cwd=CASES, env=env,
                       capture_output=True, text=True, timeout=120)
    lines = p.stdout.split("\n")
    got = next((ln for ln in reversed(lines) if ln.startswith("VERDICT ")), "")
    assert p.returncode == 0 and got, p.stderr[-3000:] or p.stdout[-3000:]
    if got == "VERDICT nofire":
        pytest.skip("the collector did not run where the case needs it on this Python")
    return got


@pytest.mark.parametrize("case", ["flush_gc.py", "double_arm.py"])
def test_state_moved_by_python_inside_the_compiled_flush_is_read_after_it(case: str) -> None:
    assert _verdict(case, pure=False) == "VERDICT ok"


@pytest.mark.parametrize("pure", [False, True], ids=["c", "pure"])
def test_completions_reach_an_inbox_a_nested_round_replaced(pure: bool) -> None:
    assert _verdict("route_inbox.py", pure=pure) == "VERDICT ok"


@pytest.mark.parametrize(("pure", "slack"), [(False, "0"), (True, "4"), (True, "5")],
                         ids=["c", "pure-4", "pure-5"])
def test_a_receiver_closed_while_its_wait_is_made_raises_closed(pure: bool, slack: str) -> None:
    assert _verdict("wait_closed.py", slack, pure=pure) == "VERDICT ok"
