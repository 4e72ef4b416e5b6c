"""zcnet server + client end to end on loopback: two servers (127.0.0.1 and 127.0.0.2), real
sockets and processes, and the fault cases (wrong token, bad input, client killed, silent client,
worker crash, two clients at once)."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from server_util import ServerProc, flow_workers, raw_session, read_frame, server, wait_for
from zcnet.bench import control as control_mod
from zcnet.bench import proto as proto
from zcnet.bench.authtoken import default_token
from zcnet.bench.client import ClientOptions, run
from zcnet.bench.control import Control, ServerRefused
from zcnet.bench.endpoint import parse_hostport
from zcnet.bench.records import ResultRow, Verify
from zcnet.errors import UsageError, ZcnetError

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

HELLO = proto.encode({"type": "hello", "version": proto.PROTOCOL_VERSION, "caps": []})


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[ServerProc, ServerProc]]:
    """Started once for the module (a server takes a second to start on this machine)."""
    tmp = tmp_path_factory.mktemp("servers")
    # A short session timeout, so that the silent-client test need not wait long.
    with server(tmp, "127.0.0.1", "--session-timeout", "2.5") as a, \
            server(tmp, "127.0.0.2", "--session-timeout", "2.5") as b:
        yield a, b


@pytest.fixture
def two_servers(servers, no_leaks) -> Iterator[tuple[ServerProc, ServerProc]]:
    """The shared servers; no_leaks still checks each test, and every test ends with no flow
    worker left on either server."""
    yield servers
    for s in servers:
        assert s.proc.poll() is None, s.log_text()
        assert wait_for(lambda s=s: not flow_workers(s.proc.pid), 10)


def test_stream_between_two_servers(two_servers):
    a, b = two_servers
    res = run(ClientOptions(src=a.address, dst=b.address, flows=2, duration=0.5,
                            write_size=64 << 10))
    assert [f.status for f in res.flows] == ["ok", "ok"]
    for f in res.flows:
        # The receiver saw exactly what the sender sent, and the flow really went to 127.0.0.2.
        assert f.bytes > 0 and f.bytes == f.bytes_sent
        assert f.gbps == pytest.approx(f.bytes * 8 / f.seconds / 1e9, rel=1e-2)
        assert f.tcp_tx.snd_cwnd > 0 and f.tcp_tx.retrans is not None
        assert 0 <= f.rx_cpu < os.cpu_count()
    assert set(res.cpus) == {"src", "dst"}
    assert res.summary.ok == 2
    assert "worker pid" in b.log_text() and "flow 1 rx" in b.log_text()
    assert "flow 0 tx" in a.log_text() and "rx worker" not in a.log_text()


def test_request_response_histogram_counts_every_transaction(two_servers):
    a, b = two_servers
    opts = ClientOptions(src=a.address, dst=b.address, mode="rr", duration=0.5, req_size=100,
                         resp_size=3000)
    res = run(opts)
    (f,) = res.flows
    assert f.status == "ok" and f.transactions > 0
    lat = f.latency
    assert lat.p50_us <= lat.p90_us <= lat.p99_us <= lat.p99_9_us <= lat.max_us
    # Summary percentiles come from the merged histograms; count == transactions.
    assert res.summary.tps == pytest.approx(f.tps)
    assert res.summary.latency.p50_us == f.latency.p50_us


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="placement needs 2 CPUs")
@pytest.mark.parametrize("pin_off", [0, 1])
def test_rx_cpu_discovery_and_pin_offset(two_servers, pin_off):
    a, b = two_servers
    res = run(ClientOptions(src=a.address, dst=b.address, flows=2, duration=0.2, cpu_min=1,
                            cpu_max=1, pin_off=pin_off))
    for f in res.flows:
        assert f.status == "ok"
        assert f.rx_cpu == 1
        assert f.rx_app_cpu == (1 + pin_off) % os.cpu_count()
    # The CPU table labels the RX CPU and the application CPU on the receiving side.
    roles = {r for sh in res.cpus["dst"].values() for r in sh.roles}
    assert {"rx-softirq", "rx-app"} <= roles


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="placement needs 2 CPUs")
def test_absolute_pins_are_applied_before_the_run(two_servers):
    a, b = two_servers
    seen: dict[str, set[int]] = {}

    def affinity(placed: list[ResultRow]) -> None:
        seen["rx"] = os.sched_getaffinity(placed[0].rx_pid)
        seen["tx"] = os.sched_getaffinity(placed[0].tx_pid)

    res = run(ClientOptions(src=a.address, dst=b.address, duration=0.2, pin_off=0,
                            rx_app_cpu=0, tx_app_cpu=1, on_started=affinity))
    assert seen == {"rx": {0}, "tx": {1}}
    (f,) = res.flows
    assert (f.rx_app_cpu, f.tx_app_cpu) == (0, 1) and f.status == "ok"


def test_wrong_token_refused_logged_nothing_run(no_leaks, tmp_path):
    token = tmp_path / "token"
    token.write_text("correct horse battery staple\n")
    token.chmod(0o600)   # token files others can read are refused
    default_token(create=True)
    with server(tmp_path, "127.0.0.2", "--token-file", str(token)) as s:
        with pytest.raises(ZcnetError, match="authentication failed"):
            run(ClientOptions(src=s.address, dst=s.address, duration=0.2, token=b"wrong token!"))
        with pytest.raises(ZcnetError, match="authentication failed"):
            # No token given: this user's token file, not the server's secret.
            run(ClientOptions(src=s.address, dst=s.address, duration=0.2))
        assert wait_for(lambda: s.log_text().count("authentication failed") >= 2, 5)
        assert "worker pid" not in s.log_text()
        res = run(ClientOptions(src=s.address, dst=s.address, duration=0.2,
                                token=b"correct horse battery staple"))
        assert res.flows[0].status == "ok"


def test_non_loopback_listen_needs_a_token():
    out = subprocess.run([sys.executable, "-m", "zcnet", "server", "--listen", "0.0.0.0:0"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "token" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("junk", [
    struct.pack("!I", proto.MAX_MESSAGE + 1),                  # announces 1 MiB + 1
    struct.pack("!I", 5) + b"\xff\xfe{[x",                      # not JSON
    proto.encode({"type": "start", "duration": 1.0}),          # valid, but out of order
])
def test_invalid_message_gets_error_and_server_keeps_serving(two_servers, junk):
    s = two_servers[0]
    with raw_session(s.address) as bad, raw_session(s.address) as idle:
        bad.sendall(junk)
        reply = read_frame(bad)
        assert reply["type"] == "error"
        assert bad.recv(1) == b""     # and the session closed
        # Another session, open all along, and a new one are both unaffected.
        idle.sendall(HELLO)
        assert read_frame(idle)["type"] == "welcome"
        res = run(ClientOptions(src=s.address, dst=s.address, duration=0.2))
        assert res.flows[0].status == "ok"


def test_client_killed_mid_run_workers_reaped(two_servers):
    s = two_servers[0]
    gone_before = s.log_text().count("client went away")
    client = subprocess.Popen([sys.executable, "-m", "zcnet", "client", "--src", s.address,
                               "-n", "2", "-t", "60"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(flow_workers(s.proc.pid)) == 4, 30), \
            f"workers never started: {s.log_text()}"
        time.sleep(0.3)  # let the run begin
        client.kill()
        client.wait()
        # Far below the 60 s run: the session noticed its client is gone.
        assert wait_for(lambda: not flow_workers(s.proc.pid), 10), flow_workers(s.proc.pid)
    finally:
        client.kill()
        client.wait()
    assert wait_for(lambda: s.log_text().count("client went away") > gone_before, 5)


def test_silent_client_reaped_by_session_timeout(two_servers):
    s = two_servers[0]
    # The shared servers run with --session-timeout 2.5.
    ctl = Control(s.address, None)
    try:
        open0 = {"type": "open", "flow": 0, "mode": "stream", "engine": "epoll",
                 "read_size": 4096, "req_size": 1, "resp_size": 1}
        ctl.request(open0)
        # A pause shorter than the timeout is fine: the session is still there.
        time.sleep(1.5)
        ctl.request({"type": "close", "flow": 0})
        ctl.request(open0)
        assert len(flow_workers(s.proc.pid)) == 1
        # Say nothing: the server ends the session after its timeout and reaps the worker.
        assert wait_for(lambda: not flow_workers(s.proc.pid), 10)
        with pytest.raises(ZcnetError, match="no message"):
            ctl.receive(5)
    finally:
        ctl.sock.close()


def test_worker_crash_is_an_error_for_that_flow_only(two_servers):
    a, b = two_servers

    def kill_flow1(placed):
        time.sleep(0.2)
        os.kill(placed[1].tx_pid, signal.SIGKILL)

    res = run(ClientOptions(src=a.address, dst=b.address, flows=3, duration=1.0,
                            on_started=kill_flow1))
    status = {f.flow: f.status for f in res.flows}
    assert status == {0: "ok", 1: "error", 2: "ok"}
    assert "died" in res.flows[1].reason
    assert all(f.bytes > 0 and f.bytes == f.bytes_sent for f in res.flows if
               f.status == "ok")


def test_two_clients_at_once(two_servers):
    a, b = two_servers
    results: dict[str, object] = {}

    def go(name: str, mode: str) -> None:
        try:
            results[name] = run(ClientOptions(src=a.address, dst=b.address, mode=mode, flows=2,
                                              duration=1.0))
        except ZcnetError as e:
            results[name] = e

    threads = [threading.Thread(target=go, args=(n, m)) for n, m in (("s", "stream"),
                                                                      ("r", "rr"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stream, rr = results["s"], results["r"]
    assert not isinstance(stream, Exception) and not isinstance(rr, Exception), results
    assert [f.status for f in stream.flows] == ["ok", "ok"]
    assert all(f.bytes == f.bytes_sent > 0 for f in stream.flows)
    assert [f.status for f in rr.flows] == ["ok", "ok"]
    assert all(f.transactions > 0 for f in rr.flows)
    # Each client got its own flows' pids: the sessions did not mix.
    assert not {f.rx_pid for f in stream.flows} & {f.rx_pid for f in rr.flows}


def test_histogram_batches_match_transactions(two_servers):
    a, b = two_servers
    res = run(ClientOptions(src=a.address, dst=b.address, mode="rr", flows=2, duration=0.3))
    # Every timed transaction reached its flow's histogram through the batched path, none
    # twice, and the session's merged histogram holds exactly the flows' samples.
    for f in res.flows:
        assert f.samples == f.transactions > 0
    assert res.summary.samples == sum(f.transactions for f in res.flows)


def test_send_paths_and_engine_refusal_through_one_server(two_servers):
    s = two_servers[0]
    res = run(ClientOptions(src=s.address, dst=s.address, duration=0.3, tx="msgzc",
                            rx_engine="uring", write_size=256 << 10, read_size=256 << 10,
                            verify=True))
    (f,) = res.flows
    assert f.status == "ok" and f.bytes == f.bytes_sent > 0
    # Every byte that crossed was the pattern at its stream offset.
    assert f.verify == Verify(checked_bytes=f.bytes, mismatches=0)
    # MSG_ZEROCOPY ran and every completion was accounted for (copied, on loopback).
    st = f.tx_stats
    assert st.path == "msgzc" and st.zerocopy + st.copied == st.sends > 0
    # zcrx on loopback is refused at open, by the real kernel, naming the device.
    with pytest.raises(ZcnetError, match=r"zcrx unsupported here.*\blo\b"):
        run(ClientOptions(src=s.address, dst=s.address, duration=0.3, rx_engine="zcrx",
                          engine_opts={"ifname": "lo", "queue": 0}))
    assert wait_for(lambda: not flow_workers(s.proc.pid), 10)


def test_server_survives_a_barrage_of_junk_sessions(two_servers):
    import random

    rng = random.Random(6)
    hello = HELLO
    s = two_servers[0]
    for i in range(150):
        junk = rng.randbytes(rng.randrange(1, 64))
        if i % 3 == 0:   # a valid hello first, then junk where auth should be
            junk = hello + junk
        elif i % 3 == 1:  # a plausible header with a random body
            junk = struct.pack("!I", len(junk)) + junk
        with raw_session(s.address) as c:
            c.sendall(junk)
            c.shutdown(socket.SHUT_WR)
            while c.recv(65536):   # whatever it says, the server ends the session
                pass
    res = run(ClientOptions(src=s.address, dst=s.address, duration=0.2))
    assert res.flows[0].status == "ok"
    assert s.proc.poll() is None and "Traceback" not in s.log_text()


def _dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def test_server_killed_takes_its_workers_along(no_leaks, tmp_path):
    with server(tmp_path, "127.0.0.1") as s:
        client = subprocess.Popen([sys.executable, "-m", "zcnet", "client", "--src", s.address,
                                   "-n", "2", "-t", "60"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            assert wait_for(lambda: len(flow_workers(s.proc.pid)) == 4, 30), s.log_text()
            workers = flow_workers(s.proc.pid)
            s.proc.kill()
            s.proc.wait()
            # No session is left to reap them: the forkserver exits, PDEATHSIG kills them.
            assert wait_for(lambda: all(_dead(p) for p in workers), 10), workers
            assert client.wait(30) == 1   # and the client reports the lost server
        finally:
            client.kill()
            client.wait()


def test_client_ctrl_c_marks_its_file_incomplete(two_servers, tmp_path):
    """Ctrl-C in the middle of a client run: no traceback, exit 130, and the JSON file says the
    run is incomplete (flows report only at their end, so it holds no figures)."""
    s = two_servers[0]
    out = tmp_path / "client.json"
    client = subprocess.Popen([sys.executable, "-m", "zcnet", "client", "--src", s.address,
                               "-n", "1", "-t", "60", "--json", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(flow_workers(s.proc.pid)) == 2, 30), s.log_text()
        client.send_signal(signal.SIGINT)
        _, err = client.communicate(timeout=60)
    finally:
        client.kill()
        client.wait()
    assert client.returncode == 130 and "Traceback" not in err
    doc = json.loads(out.read_text())
    assert doc["kind"] == "client" and doc["complete"] is False and doc["results"] == []
    # The session noticed its client went away: its workers are reaped.
    assert wait_for(lambda: not flow_workers(s.proc.pid), 10), flow_workers(s.proc.pid)


# ---- session faults, port parsing, bounded close, remote server output ---------------------------

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
    with raw_session(srv.address) as c:
        if where == "auth":
            c.sendall(HELLO)
            assert read_frame(c)["type"] == "welcome"
        c.sendall(err)
        c.settimeout(10)
        while c.recv(65536):   # the server ends the session
            pass
    res = run(ClientOptions(src=srv.address, dst=srv.address, duration=0.2))
    assert res.flows[0].status == "ok"


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
            assert [(f["status"], f["reason"]) for f in res["flows"]] == [("ok", "")] * 2
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
    hello = HELLO
    bad_auth = proto.encode({"type": "auth", "mac": "0" * 64})
    with remote:
        assert remote.address
        for _ in range(500):   # ~2 warnings of ~100 bytes each: well past 64 KiB
            with raw_session(remote.address) as c:
                c.sendall(hello)
                read_frame(c)
                c.sendall(bad_auth)
                with pytest.raises(ConnectionError):  # the error reply, then EOF
                    while True:
                        if read_frame(c)["type"] == "error":
                            raise ConnectionError
        with raw_session(remote.address) as c:
            c.settimeout(5)
            c.sendall(hello)
            assert read_frame(c)["type"] == "welcome"


def test_nan_session_timeout_is_a_usage_error():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "zcnet", "server", "--listen", "127.0.0.1:0",
                          "--session-timeout", "nan"], capture_output=True, text=True,
                         timeout=30, stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_host_details_are_sent_only_after_authentication(srv):
    """welcome goes to anyone who connects: the kernel release and hostname wait for auth_ok."""
    with raw_session(srv.address) as c:
        c.sendall(HELLO)
        welcome = read_frame(c)
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
            raw_session(s.address) as c:
        c.settimeout(HANDSHAKE_TIMEOUT + 30)
        # Say nothing. The server closes us after the handshake deadline, not after 600 s.
        while c.recv(65536):
            pass
