"""The zcnet.aio examples run end to end (small sizes) and check their own bytes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("argv", [
    ["aio_ingest.py", "--streams", "8", "--mib", "2"],
    ["aio_ingest.py", "--streams", "4", "--mib", "1", "--uvloop", "--out", "{tmp}"],
    ["aio_ingest.py", "--streams", "4", "--mib", "1", "--rcvlowat", "0"],
    ["aio_ingest.py", "--streams", "16", "--mib", "2", "--pool", "--out", "{tmp}"],
    ["aio_echo.py", "--clients", "5", "--requests", "20"],
    ["aio_echo.py", "--clients", "3", "--requests", "20", "--uvloop"],
    ["aio_echo.py", "--clients", "5", "--requests", "20", "--callbacks"],
    ["aio_echo.py", "--clients", "3", "--requests", "20", "--callbacks", "--uvloop"],
])
def test_example_runs(argv, tmp_path, no_leaks):
    args = [a.format(tmp=tmp_path) for a in argv]
    p = subprocess.run([sys.executable, str(EXAMPLES / args[0]), *args[1:]],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "every" in p.stdout and "Traceback" not in p.stderr
    if "--out" in args:
        n, mib = int(args[args.index("--streams") + 1]), int(args[args.index("--mib") + 1])
        assert sorted(f.stat().st_size for f in tmp_path.iterdir()) == [mib << 20] * n
