"""Review findings on the send paths: waits that must end by their deadline."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from zcnet.errors import ZcnetError
from zcnet.tx.sendzc import SendZcSender
from zcnet.tx.sink import Sink


class _Interrupted(Exception):
    pass


def _alarm(_sig: int, _frame: object) -> None:
    raise _Interrupted


@pytest.fixture
def stalled_pair():
    """A loopback TCP pair whose receiver never reads, with small buffers on both sides."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    client.connect(ls.getsockname())
    server, _ = ls.accept()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    ls.close()
    old = signal.signal(signal.SIGALRM, _alarm)
    yield client, server
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
    client.close()
    server.close()


@pytest.mark.parametrize("fixed", [True, False])
def test_sendzc_flush_and_close_end_by_their_deadline_when_the_peer_stalls(
        no_leaks, stalled_pair, fixed: bool) -> None:
    client, _server = stalled_pair
    buf = bytearray(8 << 20)
    s = SendZcSender(client, buf, slots=1, fixed=fixed)
    try:
        # The send cannot complete (nobody reads): interrupt it as Ctrl-C would.
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted):
            s.send(len(buf))
        assert s.outstanding
        # flush(timeout) must give up after about that long, not wait for the peer forever.
        signal.setitimer(signal.ITIMER_REAL, 5.0)  # the failure guard
        t0, cpu0 = time.monotonic(), time.process_time()
        with pytest.raises(ZcnetError, match="unacknowledged"):
            s.flush(timeout=0.3)
        assert time.monotonic() - t0 < 2.0
        assert time.process_time() - cpu0 < 0.1, "flush spun instead of sleeping in the kernel"
        signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        # Giving up on the connection ends the parked send, so close() returns at once.
        client.shutdown(socket.SHUT_RDWR)
        signal.setitimer(signal.ITIMER_REAL, 10.0)
        s.close()
        signal.setitimer(signal.ITIMER_REAL, 0)


def _garbled_sink(cmd: list[str], **kw: object) -> subprocess.Popen[str]:
    """A 'sink' that prints something other than its JSON port line, then lingers."""
    code = "print('Warning: not json', flush=True); import time; time.sleep(30)"
    return subprocess.Popen([sys.executable, "-c", code], **kw)  # type: ignore[call-overload]


def test_sink_start_failure_is_an_error_and_stops_the_process(no_leaks) -> None:
    t0 = time.monotonic()
    with pytest.raises(ZcnetError, match="sink"):
        Sink("127.0.0.1", (64,), spawn=_garbled_sink)
    assert time.monotonic() - t0 < 5.0
