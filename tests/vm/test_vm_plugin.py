"""The vm test plugin seen from outside: a small project of vm tests run by a fresh pytest on the
host, whose outcomes must be the ones inside the VM (or skips naming why no VM could boot)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from paths import TESTS
from zcnet.vm.sources import MIRROR_ENV

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest
import vmplugin

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    vmplugin.collection_modifyitems(config, items)

def pytest_collection_finish(session):
    vmplugin.collection_finish(session)

def pytest_runtest_logreport(report):
    vmplugin.runtest_logreport(report)
"""

TESTS_PY = """
import os
import pytest

pytestmark = pytest.mark.vm

def test_inside():
    assert os.environ.get("ZCNET_IN_VM") == "1"

def test_fails_inside():
    assert os.uname().release == "no such release", "inner-boom"

def test_skips_inside():
    pytest.skip("inner-skip-reason")
"""


def _project(tmp_path: Path) -> Path:
    tmp_path.mkdir()
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TESTS_PY)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    vm: in the VM\n")
    return tmp_path


def _pytest(project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in
                                        env.get("PYTHONPATH", "").split(os.pathsep) if p)
    return subprocess.run([sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider",
                           "-p", "no:hypothesispytest"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=1200)


def test_no_vm_means_every_vm_test_skips_with_the_reason(tmp_path: Path) -> None:
    project = _project(tmp_path / "p")
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
               **{MIRROR_ENV: "http://127.0.0.1:9/debian"})
    proc = _pytest(project, env)
    assert "3 skipped" in proc.stdout, proc.stdout + proc.stderr
    assert "SKIPPED [3]" in proc.stdout
    assert "cannot boot a VM: cannot reach the Debian archive" in proc.stdout


@pytest.mark.slow
def test_inner_outcomes_come_back(tmp_path: Path) -> None:
    proc = _pytest(_project(tmp_path / "p"), dict(os.environ))
    out = proc.stdout
    if "cannot boot a VM" in out:
        pytest.skip("no VM on this machine: " + out.splitlines()[-1])
    assert "1 failed, 1 passed, 1 skipped" in out, out + proc.stderr
    assert "PASSED test_inner.py::test_inside" in out
    assert "inner-boom" in out and "inside the VM (call)" in out
    assert "inside the VM: inner-skip-reason" in out
