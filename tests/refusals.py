"""Running a zcnet command that must refuse, and checking the refusal is as the CLI promises:
the exit status, one error line naming the problem (and a fix line, or argparse's usage before
it), no traceback."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from zcnet.cli import main


def run_main(*argv: str) -> tuple[int, str, str]:
    """``zcnet ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:   # argparse
            rc = exc.code if isinstance(exc.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def run_zcnet(*argv: str, env: Mapping[str, str] | None = None, timeout: float = 60,
              **kw: Any) -> subprocess.CompletedProcess[str]:
    """``zcnet ARGV`` as a subprocess (for the cases that could hang: ``timeout`` bounds them)."""
    full = dict(os.environ if env is None else env)
    if "PYTHONPATH" in full:   # absolute, so that ``cwd`` may differ
        full["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p)
                                             for p in full["PYTHONPATH"].split(os.pathsep))
    return subprocess.run([sys.executable, "-m", "zcnet", *argv], capture_output=True,
                          text=True, timeout=timeout, env=full, **kw)


def refusal(rc: int, err: str, code: int, *needles: str | Path,
            progress: tuple[str, ...] = ()) -> str:
    """Assert a refusal: exit ``code``, no traceback, exactly one error line (with at most a
    fix line after it, or argparse's usage lines before it, and lines starting with one of
    ``progress`` that the command prints as it goes), and every needle in the message.
    Returns the error line."""
    assert rc == code, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln]
    assert len(errors) == 1, err
    others = [ln for ln in lines if ln not in errors and not ln.startswith(
        ("usage:", " ", "zcnet: fix:", "zcnet: WARNING:", *progress))]
    assert not others, err
    assert sum(ln.startswith("zcnet: fix:") for ln in lines) <= 1, err
    for needle in needles:
        assert str(needle) in err, (needle, err)
    return errors[0]
