"""Review findings in zcnet server / client: real servers on loopback, real sockets."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from test_server_e2e import ServerProc, _raw_session, _read_frame, flow_workers, server, wait_for
from zcnet.bench import control as control_mod
from zcnet.bench import proto as proto
from zcnet.bench.client import ClientOptions, run
from zcnet.bench.control import Control, ServerRefused
from zcnet.bench.endpoint import parse_hostport
from zcnet.errors import UsageError

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

OPEN0 = {"type": "open", "flow": 0, "mode": "stream", "engine": "epoll", "read_size": 4096,
         "req_size": 1, "resp_size": 1}


@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[ServerProc]:
    with server(tmp_path_factory.mktemp("review"), "127.0.0.1") as s:
        yield s


@pytest.fixture
def no_traceback(srv) -> Iterator[None]:
    """The shared server logs no new traceback during the test."""
    before = srv.log_text().count("Traceback")
    yield
    time.sleep(0.3)
    assert srv.log_text().count("Traceback") == before, srv.log_text()


@pytest.mark.parametrize("where", ["hello", "auth"])
def test_error_message_instead_of_hello_or_auth_ends_the_session_quietly(srv, no_traceback,
                                                                          where):
    err = proto.encode({"type": "error", "code": "bye", "message": "changed my mind"})
    with _raw_session(srv.address) as c:
        if where == "auth":
            c.sendall(proto.encode({"type": "hello", "version": 1, "caps": []}))
            assert _read_frame(c)["type"] == "welcome"
        c.sendall(err)
        c.settimeout(10)
        while c.recv(65536):   # the server ends the session
            pass
    res = run(ClientOptions(src=srv.address, dst=srv.address, duration=0.2))
    assert res.flows[0]["status"] == "ok"


def test_pin_of_a_dead_worker_is_an_error_reply_not_a_lost_connection(srv):
    ctl = Control(srv.address, None)
    try:
        ctl.request(OPEN0)
        (pid,) = flow_workers(srv.proc.pid)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10)
        with pytest.raises(ServerRefused):
            ctl.request({"type": "pin", "flow": 0, "cpu": 0, "role": "rx"})
    finally:
        ctl.sock.close()
    assert wait_for(lambda: not flow_workers(srv.proc.pid), 10)


def test_duplicate_bufsize_engine_option_does_not_crash_the_worker(srv, no_traceback):
    ctl = Control(srv.address, None)
    try:
        opened = ctl.request({**OPEN0, "engine_opts": {"bufsize": 8192}})
        assert opened["port"] > 0
        ctl.request({"type": "close", "flow": 0})
    finally:
        ctl.close()


def test_two_runs_in_one_session(srv):
    ctl = Control(srv.address, None)
    try:
        for _ in range(2):
            port = ctl.request(OPEN0)["port"]
            ctl.request({"type": "connect", "flow": 0, "host": "127.0.0.1", "port": port,
                         "mode": "stream", "tx": "copy", "write_size": 4096, "req_size": 1,
                         "resp_size": 1})
            res = ctl.request({"type": "start", "duration": 0.05})
            assert [f.get("error") for f in res["flows"]] == [None, None]
    finally:
        ctl.close()


@pytest.mark.parametrize("text", ["127.0.0.1:70000", "127.0.0.1:-1", "[::1]:65536"])
def test_port_out_of_range_is_a_usage_error(text):
    with pytest.raises(UsageError):
        parse_hostport(text)


@pytest.mark.timeout(30)
def test_client_close_is_bounded_when_the_server_goes_silent(monkeypatch):
    """A server that completes the handshake and then never answers: close() gives up soon."""
    monkeypatch.setattr(control_mod, "CLOSE_TIMEOUT", 0.5)
    ls = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def fake_server() -> None:
        c, _ = ls.accept()
        with c:
            conn = proto.Connection(proto.Role.SERVER)
            conn.receive_data(c.recv(65536))
            conn.next_event()
            c.sendall(conn.send({"type": "welcome", "version": 1, "caps": [],
                                 "challenge": proto.new_challenge(), "cpus": 1,
                                 "limits": proto.Limits().to_wire()}))
            conn.receive_data(c.recv(65536))
            conn.next_event()
            c.sendall(conn.send({"type": "auth_ok"}))
            done.wait()   # silent until the test ends

    t = threading.Thread(target=fake_server, daemon=True)
    t.start()
    try:
        ctl = Control(f"127.0.0.1:{ls.getsockname()[1]}", None)
        ctl.close()  # a close that waited for the silent server would hit the test's timeout
    finally:
        done.set()
        t.join(5)
        ls.close()


def test_remote_server_keeps_serving_after_its_stderr_outgrew_a_pipe(no_leaks, tmp_path):
    """The ssh-started server's stderr is a pipe to us: unread, its warnings (one per refused
    session) fill it and the server blocks in logging for good."""
    import sys

    from test_server_remote import FAKE_SSH, free_port, script
    from zcnet.bench.remote import RemoteServer

    ssh = script(tmp_path, "ssh", FAKE_SSH)
    remote = RemoteServer("127.0.0.1", port=free_port(), listen="127.0.0.1", ssh=ssh,
                          python=sys.executable)
    hello = proto.encode({"type": "hello", "version": 1, "caps": []})
    bad_auth = proto.encode({"type": "auth", "mac": "0" * 64})
    with remote:
        assert remote.address
        for _ in range(500):   # ~2 warnings of ~100 bytes each: well past 64 KiB
            with _raw_session(remote.address) as c:
                c.sendall(hello)
                _read_frame(c)
                c.sendall(bad_auth)
                with pytest.raises(ConnectionError):  # the error reply, then EOF
                    while True:
                        if _read_frame(c)["type"] == "error":
                            raise ConnectionError
        with _raw_session(remote.address) as c:
            c.settimeout(5)
            c.sendall(hello)
            assert _read_frame(c)["type"] == "welcome"


def test_nan_session_timeout_is_a_usage_error():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "zcnet", "server", "--listen", "127.0.0.1:0",
                          "--session-timeout", "nan"], capture_output=True, text=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_host_details_are_sent_only_after_authentication(srv):
    """welcome goes to anyone who connects: the kernel release and hostname wait for auth_ok."""
    with _raw_session(srv.address) as c:
        c.sendall(proto.encode({"type": "hello", "version": 1, "caps": []}))
        welcome = _read_frame(c)
        assert welcome["type"] == "welcome" and "host" not in welcome
    ctl = Control(srv.address, None)
    try:
        assert ctl.env["kernel"] == os.uname().release
    finally:
        ctl.close()


def test_ready_line_split_across_reads_gives_the_whole_address(no_leaks, tmp_path):
    """ssh may deliver the ready line in pieces: only a complete line names the address."""
    from test_server_remote import script
    from zcnet.bench.remote import RemoteServer

    ssh = script(tmp_path, "ssh", "#!/bin/sh\nprintf 'zcnet server listening on 127.0'\n"
                 "sleep 0.3\nprintf '.0.1:4242\\n'\nexec cat >/dev/null\n")
    with RemoteServer("h", port=4242, ssh=ssh) as remote:
        assert remote.address == "127.0.0.1:4242"


def test_unauthenticated_idle_connection_is_dropped_long_before_the_session_timeout(tmp_path):
    """Idle, unauthenticated peers must not hold the 64 session slots for a whole session
    timeout: the handshake has its own short deadline (HANDSHAKE_TIMEOUT)."""
    from zcnet.bench.session import HANDSHAKE_TIMEOUT

    with server(tmp_path, "127.0.0.1", "--session-timeout", "600") as s, \
            _raw_session(s.address) as c:
        c.settimeout(HANDSHAKE_TIMEOUT + 30)
        # Say nothing. The server closes us after the handshake deadline, not after 600 s.
        while c.recv(65536):
            pass
