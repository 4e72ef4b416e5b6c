from __future__ import annotations

import contextlib
import io
import os
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import vmplugin
from leaks import Snapshot


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    vmplugin.collection_modifyitems(config, items)
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root for network namespaces")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


def pytest_sessionstart(session: pytest.Session) -> None:
    """zcnet's bytecode, written once. With PYTHONDONTWRITEBYTECODE set (as on CI) every
    interpreter the tests start, hundreds on the host and each one in the TCG guests (~1 s
    there, reading the host's tree), would compile zcnet's modules again. Not inside a VM: its
    root is read-only."""
    if not vmplugin.IN_VM:
        import compileall

        import zcnet

        compileall.compile_dir(Path(zcnet.__file__).parent, quiet=2)


def pytest_collection_finish(session: pytest.Session) -> None:
    vmplugin.collection_finish(session)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    vmplugin.runtest_logreport(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    vmplugin.terminal_summary(terminalreporter.config, terminalreporter.write_line)


@pytest.fixture(scope="session", autouse=True)
def _libraries_warm() -> None:
    """scipy (BLAS buffers, 64 MiB and more) and matplotlib (font files kept open, caches) set
    up memory and fds of their own the first time they are used, for the life of the process:
    use them once before any test, so no_leaks does not take that for a test's leak.

    Not inside a VM: the vm tests use neither, and importing them there over 9p under TCG takes
    tens of seconds (a vm test that did use them would see no_leaks report their first use)."""
    if vmplugin.IN_VM:
        Snapshot.take()
        return
    with contextlib.suppress(ImportError):
        from scipy import stats

        stats.ttest_ind([1.0, 2.0, 3.0], [2.0, 3.0, 5.0], equal_var=False)
    with contextlib.suppress(ImportError):
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure

        fig = Figure()
        fig.add_subplot().set_title("warm")
        fig.savefig(io.BytesIO(), format="png")
    Snapshot.take()  # and the snapshot's own first-use costs (imports, caches)


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves namespaces, veths, netdevsim devices, processes or VMs, fds,
    io_uring/dma-buf/memfd mappings or anonymous memory (areas) behind (see leaks.py)."""
    before = Snapshot.take()
    yield
    # Children and fds may take a moment to be reaped after a worker exits.
    deadline = time.monotonic() + 5
    while True:
        problems = Snapshot.take().leaked_since(before)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not problems, "; ".join(problems)


@pytest.fixture
def tcp_pair():
    """A connected TCP pair on loopback: (client, server), both closed afterwards."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    client = socket.create_connection(ls.getsockname())
    server, _ = ls.accept()
    ls.close()
    yield client, server
    client.close()
    server.close()


@pytest.fixture(autouse=True, scope="session")
def private_config_home(tmp_path_factory: pytest.TempPathFactory):
    """Token files (``zcnet server`` without --token-file creates one) go to a directory of the
    test session, never to the user's real ~/.config; servers the tests start inherit it."""
    old = os.environ.get("XDG_CONFIG_HOME")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    yield
    if old is None:
        os.environ.pop("XDG_CONFIG_HOME", None)
    else:
        os.environ["XDG_CONFIG_HOME"] = old
