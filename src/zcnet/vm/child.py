"""Child processes that end with the zcnet process that started them.

``PR_SET_PDEATHSIG`` delivers a signal to the child when its parent dies, however it dies
(SIGKILL included, when no Python cleanup runs). It is set in the child between fork and exec.
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def pdeathsig(sig: signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn`` that has the child receive ``sig`` when this process dies."""
    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return arm
