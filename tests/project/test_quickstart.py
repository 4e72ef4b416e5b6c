"""The README's Quickstart on a distribution Python that refuses system-wide pip (PEP 668).

Both commands run on a copy of the project with the system's /usr/bin/python3: the scripts must
notice the EXTERNALLY-MANAGED marker, make a venv that does not see the system's site-packages
(so a dependency missing from pyproject.toml fails here), install into it from PyPI and run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from paths import FIXTURES, ROOT

SYSTEM_PYTHON = Path("/usr/bin/python3")


def _managed(python: Path) -> bool:
    code = ("import os, sys, sysconfig; print(os.path.exists(os.path.join("
            "sysconfig.get_path('stdlib'), 'EXTERNALLY-MANAGED')))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() == "True"


def _copy_project(dst: Path) -> Path:
    ignore = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build",
                                    ".pytest_cache", ".ruff_cache", ".hypothesis")
    for name in ("src", "tests", "scripts", "benchmarks", "examples", "docs"):
        shutil.copytree(ROOT / name, dst / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    return dst


@pytest.mark.slow
@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="no /usr/bin/python3")
def test_quickstart_with_a_pep668_system_python(tmp_path: Path) -> None:
    if not _managed(SYSTEM_PYTHON):
        pytest.skip("/usr/bin/python3 is not EXTERNALLY-MANAGED here: nothing to work around")
    repo = _copy_project(tmp_path / "zcnet")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "ZCNET_VENV")}
    env["PYTHON"] = str(SYSTEM_PYTHON)
    # Plain pip is refused on this Python: the premise of the test.
    refused = subprocess.run([str(SYSTEM_PYTHON), "-m", "pip", "install", "--dry-run", "rich"],
                             capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "externally-managed" in refused.stderr

    lo_mtu = Path("/sys/class/net/lo/mtu").read_text().strip()
    bench = subprocess.run(["bash", "scripts/bench.sh", "--no-lab", "--duration", "0.2",
                            "--engine", "epoll", "--placement", "same", "--mtu", lo_mtu],
                           cwd=repo, capture_output=True, text=True, timeout=900, env=env)
    assert bench.returncode == 0, bench.stderr[-3000:]
    assert "using a venv" in bench.stderr and "Gbit/s" in bench.stdout
    venv = repo / ".venv"
    cfg = (venv / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg
    # The installed command works, and plots come with the default install.
    assert subprocess.run([str(venv / "bin" / "zcnet"), "--help"], capture_output=True,
                          timeout=60, env=env).returncode == 0
    plots = subprocess.run([str(venv / "bin" / "zcnet"), "run", "--report",
                            str(FIXTURES / "tx-mpwqe.json"), "--plots", str(tmp_path / "png")],
                           capture_output=True, text=True, timeout=120, env=env)
    assert plots.returncode == 0, plots.stderr
    assert list((tmp_path / "png").glob("*.png"))

    # The second Quickstart command: test dependencies into the same venv, ruff, then pytest.
    test = subprocess.run(["bash", "scripts/test.sh", "-q", "-p", "no:cacheprovider",
                           "tests/report/test_report_stats.py"],
                          cwd=repo, capture_output=True, text=True, timeout=900, env=env)
    assert test.returncode == 0, (test.stdout + test.stderr)[-3000:]
    assert " passed" in test.stdout
