from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import uvloop

sys.path.insert(0, str(Path(__file__).parent))

from leaks import Snapshot


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root for network namespaces")
        for item in items:
            if "root" in item.keywords:
                item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_asyncio_loop_factories(config, item):
    """The event loops pytest-asyncio tests may ask for with mark.asyncio(loop_factories=...);
    zcnet.aio supports both."""
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves namespaces, veths, children, fds or io_uring mappings behind."""
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
