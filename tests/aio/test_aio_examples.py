"""The zcnet.aio examples run end to end (small sizes) and check their own bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from paths import ROOT

EXAMPLES = ROOT / "examples"


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


@pytest.mark.parametrize("example", ["aio_ingest.py", "aio_echo.py"])
def test_uvloop_missing_names_the_extra(example: str) -> None:
    """--uvloop where uvloop cannot be imported: one line naming the extra to install."""
    code = ("import runpy, sys; sys.modules['uvloop'] = None; "  # import uvloop now fails
            f"sys.argv = [{example!r}, '--uvloop']; sys.path.insert(0, {str(EXAMPLES)!r}); "
            f"runpy.run_path({str(EXAMPLES / example)!r}, run_name='__main__')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert p.stderr.strip() == ("error: --uvloop needs uvloop, which is not installed; install "
                                "zcnet's aio extra: pip install 'zcnet[aio]'")
