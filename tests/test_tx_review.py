"""Review findings on the send paths: waits that must end by their deadline."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from zcnet.errors import ZcnetError
from zcnet.tx.sendzc import SendZcSender
from zcnet.tx.sink import Sink

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


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


@pytest.mark.timeout(60, method="thread")  # the test uses SIGALRM itself
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
        signal.setitimer(signal.ITIMER_REAL, 30.0)  # the failure guard
        enters = _count_calls(s.ring, "submit")
        with pytest.raises(ZcnetError) as stuck:
            s.flush(timeout=0.3)
        assert stuck.value.message == \
            f"{s.outstanding} zero-copy sends still unacknowledged after 0.3 s"
        assert s.outstanding >= 1
        # One enter that sleeps out the deadline, perhaps one more if the kernel woke early; a
        # flush that spun instead of sleeping in the kernel would enter over and over.
        assert 1 <= enters[0] <= 3, f"flush entered the kernel {enters[0]} times"
        signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        # Giving up on the connection ends the parked send, so close() returns at once.
        client.shutdown(socket.SHUT_RDWR)
        signal.setitimer(signal.ITIMER_REAL, 10.0)
        s.close()
        signal.setitimer(signal.ITIMER_REAL, 0)


def _count_calls(obj: object, name: str) -> list[int]:
    """Count calls of ``obj.name`` from now on (the count is element 0 of the returned list)."""
    count = [0]
    real = getattr(obj, name)

    def counted(*a: object, **kw: object) -> object:
        count[0] += 1
        return real(*a, **kw)

    setattr(obj, name, counted)
    return count


def _garbled_sink(cmd: list[str], **kw: object) -> subprocess.Popen[str]:
    """A 'sink' that prints something other than its JSON port line, then lingers."""
    code = "print('Warning: not json', flush=True); import time; time.sleep(3600)"
    return subprocess.Popen([sys.executable, "-c", code], **kw)  # type: ignore[call-overload]


@pytest.mark.timeout(60)
def test_sink_start_failure_is_an_error_and_stops_the_process(no_leaks) -> None:
    """The sink lingers for an hour: waiting for it would hit the timeout; no_leaks checks
    that it was stopped."""
    with pytest.raises(ZcnetError, match="sink"):
        Sink("127.0.0.1", (64,), spawn=_garbled_sink)
