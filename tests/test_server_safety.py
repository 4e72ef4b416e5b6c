"""Safety of zcnet server: every listener authenticates (per-user token files, refused when
others can read them), floods of unauthenticated connections do not lock real clients out,
worker failures reach the client with their cause, and a SIGKILLed server's temporary files are
swept. Real servers, real sockets, a real unprivileged user where the machine has one."""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from server_util import READY, ServerProc, raw_session, read_frame, server, wait_for
from zcnet.bench import proto as proto
from zcnet.bench.authtoken import default_token, default_token_path, read_token
from zcnet.bench.client import ClientOptions, run
from zcnet.bench.control import Control, ServerRefused
from zcnet.bench.server import MAX_PENDING
from zcnet.errors import UsageError

pytestmark = pytest.mark.timeout(180)

HELLO = proto.encode({"type": "hello", "version": proto.PROTOCOL_VERSION, "caps": []})


@pytest.fixture
def config_home(tmp_path, monkeypatch) -> Path:
    """A fresh XDG_CONFIG_HOME for this test and the servers it starts."""
    home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    return home


def _cli(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zcnet", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


# ---- token files -------------------------------------------------------------------------------

def test_first_use_creates_a_private_token_file(config_home):
    path = default_token_path()
    assert path == config_home / "zcnet" / "token" and not path.exists()
    token = default_token(create=True)
    assert len(token) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert default_token(create=True) == token == default_token(create=False)   # reused
    assert [p.name for p in path.parent.iterdir()] == ["token"]   # no temporary left over


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602])
def test_token_file_others_can_read_or_write_is_refused(tmp_path, mode):
    f = tmp_path / "token"
    f.write_text("correct horse battery staple\n")
    f.chmod(mode)
    with pytest.raises(UsageError, match="accessible to other users") as exc:
        read_token(f)
    assert exc.value.hint == f"chmod 600 {f}"
    f.chmod(0o600)
    assert read_token(f) == b"correct horse battery staple"


def test_default_token_that_is_a_symlink_or_in_an_open_directory_is_refused(config_home,
                                                                            tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("0123456789abcdef\n")
    target.chmod(0o600)
    d = config_home / "zcnet"
    d.mkdir(parents=True, mode=0o700)
    (d / "token").symlink_to(target)
    for create in (True, False):
        with pytest.raises(UsageError, match="is a symlink"):
            default_token(create=create)
    (d / "token").unlink()
    d.chmod(0o777)
    with pytest.raises(UsageError, match="accessible to other users") as exc:
        default_token(create=True)
    assert exc.value.hint == f"chmod 700 {d}"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_token_file_owned_by_another_user_is_refused(tmp_path):
    f = tmp_path / "token"
    f.write_text("correct horse battery staple\n")
    f.chmod(0o600)
    nobody = pwd.getpwnam("nobody")
    os.chown(f, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(UsageError, match="belongs to user nobody"):
        read_token(f)


def test_server_refuses_a_readable_token_file_with_the_fix(tmp_path):
    f = tmp_path / "token"
    f.write_text("correct horse battery staple\n")
    f.chmod(0o644)
    out = _cli("server", "--listen", "127.0.0.1:0", "--token-file", str(f))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "accessible to other users" in out.stderr and f"chmod 600 {f}" in out.stderr


def test_server_without_token_file_creates_one_and_the_client_finds_it(config_home, tmp_path,
                                                                       no_leaks):
    path = config_home / "zcnet" / "token"
    with server(tmp_path, "127.0.0.1") as s:
        assert path.stat().st_mode & 0o777 == 0o600
        assert f"created token file {path}" in s.log_text()
        # The library client and the command read the same file by default.
        assert run(ClientOptions(src=s.address, dst=s.address, duration=0.2)).summary.ok == 1
        out = _cli("client", "--src", s.address, "-t", "0.2")
        assert out.returncode == 0, out.stderr
        # Anyone else's token (or none) is refused: the empty key no longer opens it.
        with pytest.raises(ServerRefused, match="authentication failed"):
            Control(s.address, b"")
    assert "Traceback" not in s.log_text()


def test_client_without_any_token_file_says_how_to_get_one(config_home):
    out = _cli("client", "--src", "127.0.0.1:9", "-t", "0.2")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(config_home / "zcnet" / "token") in out.stderr
    assert "zcnet server" in out.stderr and "--token-file" in out.stderr


# What an unprivileged local user tries against a root server: the empty key (which a loopback
# server without a token accepted), then root's token file. Only the standard library, because
# the user cannot reach this interpreter's installation (under /root).
NOBODY_SCRIPT = r"""
import hashlib, hmac, json, socket, struct, sys
host, port, token_file, version = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def frame(msg):
    data = json.dumps(msg).encode()
    return struct.pack("!I", len(data)) + data
def read(sock):
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return {"type": "eof"}
        head += chunk
    (n,) = struct.unpack("!I", head)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return json.loads(body)
s = socket.create_connection((host, port), timeout=10)
s.sendall(frame({"type": "hello", "version": version, "caps": []}))
welcome = read(s)
mac = hmac.new(b"", b"zcnet-auth-v1:" + welcome["challenge"].encode(), hashlib.sha256)
s.sendall(frame({"type": "auth", "mac": mac.hexdigest()}))
reply = read(s)
print("auth:", reply.get("type"), reply.get("code"))
if reply.get("type") == "auth_ok":   # what the hole allowed: a listener on port 80
    s.sendall(frame({"type": "open", "flow": 0, "mode": "stream", "engine": "epoll",
                     "read_size": 4096, "req_size": 1, "resp_size": 1, "port": 80}))
    print("open:", read(s).get("type"))
try:
    open(token_file).read()
    print("token: read")
except OSError as e:
    print("token:", type(e).__name__)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a root server")
@pytest.mark.skipif(not (shutil.which("setpriv") and Path("/usr/bin/python3").exists()),
                    reason="needs setpriv (util-linux) and /usr/bin/python3")
def test_unprivileged_user_cannot_drive_a_root_loopback_server(tmp_path, monkeypatch, no_leaks):
    # Every directory on the way traversable by nobody, so that only the token file's own mode
    # keeps it out (pytest's tmp_path lies below a 0700 directory).
    shared = Path(tempfile.mkdtemp(prefix="zcnet-test-"))
    try:
        shared.chmod(0o755)
        monkeypatch.setenv("XDG_CONFIG_HOME", str(shared / "config"))
        script = shared / "nobody.py"
        script.write_text(NOBODY_SCRIPT)
        script.chmod(0o644)
        with server(tmp_path, "127.0.0.1") as s:
            host, port = s.address.rsplit(":", 1)
            out = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup",
                                  "--clear-groups", "/usr/bin/python3", str(script), host, port,
                                  str(default_token_path()), str(proto.PROTOCOL_VERSION)],
                                 capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL, cwd="/")
            assert out.returncode == 0, out.stderr
            assert "auth: error auth" in out.stdout, out.stdout
            assert "token: PermissionError" in out.stdout, out.stdout
            assert wait_for(lambda: "authentication failed" in s.log_text(), 5)
            assert "worker pid" not in s.log_text()
            # root's own client still gets in.
            res = run(ClientOptions(src=s.address, dst=s.address, duration=0.2))
            assert res.summary.ok == 1
    finally:
        shutil.rmtree(shared)


# ---- floods ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def srv(tmp_path_factory) -> Iterator[ServerProc]:
    with server(tmp_path_factory.mktemp("safety"), "127.0.0.1", "--session-timeout", "60") as s:
        yield s


def _flood(address: str, n: int, rng: random.Random) -> list[socket.socket]:
    """n connections that never authenticate: silent, a hello and then nothing, half a frame,
    or garbage that keeps the connection open."""
    socks = []
    for i in range(n):
        c = raw_session(address)
        kind = i % 4
        if kind == 1:
            c.sendall(HELLO)
        elif kind == 2:
            c.sendall(struct.pack("!I", 200) + b'{"type": "hel')
        elif kind == 3:
            c.sendall(rng.randbytes(3))
        socks.append(c)
    return socks


def test_flood_of_silent_connections_does_not_lock_out_a_real_client(srv):
    rng = random.Random(14)
    flood = _flood(srv.address, 200, rng)
    try:
        # The whole flood is held open while a real client connects, authenticates and runs.
        res = run(ClientOptions(src=srv.address, dst=srv.address, duration=0.3))
        assert res.summary.ok == 1 and res.flows[0].bytes > 0
        # The server held at most MAX_PENDING of them: the oldest were let go (a timed-out
        # handshake is let go too, so this says only that nothing hangs on to them).
        for c in flood[: 200 - MAX_PENDING]:
            c.settimeout(30)
            with contextlib.suppress(ConnectionError):
                while c.recv(65536):
                    pass
    finally:
        for c in flood:
            c.close()
    assert srv.proc.poll() is None and "Traceback" not in srv.log_text()


def test_garbage_from_peers_never_hurts_the_server(srv):
    rng = random.Random(1414)
    frames = [struct.pack("!I", proto.MAX_PREAUTH_MESSAGE + 1),   # a big frame before auth
              struct.pack("!I", 0xFFFFFFFF),
              HELLO + HELLO,                                        # hello twice
              HELLO + proto.encode({"type": "auth", "mac": "z" * 64}),
              HELLO + proto.encode({"type": "open", "flow": 0}),    # a request before auth
              proto.encode({"type": "error", "code": "x", "message": "y" * 5000})]
    for i in range(120):
        junk = frames[i % len(frames)] if i < 2 * len(frames) else rng.randbytes(
            rng.randrange(1, 300))
        with raw_session(srv.address) as c:
            # The server may end the session (a reset) before all of it is sent or before the
            # shutdown: ENOTCONN or ECONNRESET here is that, not a failure.
            with contextlib.suppress(OSError):
                c.sendall(junk)
                c.shutdown(socket.SHUT_WR)
            c.settimeout(10)
            with contextlib.suppress(ConnectionError):
                while c.recv(65536):   # whatever it says, the server ends the session
                    pass
    res = run(ClientOptions(src=srv.address, dst=srv.address, duration=0.2))
    assert res.summary.ok == 1
    assert srv.proc.poll() is None and "Traceback" not in srv.log_text()


def test_unauthenticated_peer_cannot_send_a_large_frame(srv):
    with raw_session(srv.address) as c:
        c.sendall(struct.pack("!I", proto.MAX_PREAUTH_MESSAGE + 1) + b"x" * 100)
        reply = read_frame(c)
    assert reply["type"] == "error" and reply["code"] == "too_big"


# ---- worker failures ---------------------------------------------------------------------------

@pytest.mark.parametrize("cpu", [99, -1, os.cpu_count() or 1])
def test_bad_consumer_cpu_fails_at_open_naming_the_option(srv, cpu):
    opts = ClientOptions(src=srv.address, dst=srv.address, duration=0.2, rx_engine="soft-zc",
                         engine_opts={"consumer": "thread", "consumer_cpu": cpu})
    with pytest.raises(ServerRefused) as exc:
        run(opts)
    # Refused at the open request (not as a run that stalls until the grace period ends).
    assert exc.value.code == "invalid"
    assert f"consumer_cpu {cpu} is not a CPU" in exc.value.reason
    assert "engine soft-zc" in exc.value.reason and "no result" not in exc.value.reason


def test_worker_failure_reaches_the_client_with_its_cause(srv):
    res = run(ClientOptions(src=srv.address, dst=srv.address, duration=0.2, rx_engine="soft-zc",
                            engine_opts={"zc_buf": 100}))
    (f,) = res.flows
    assert f.status == "error"
    assert "rx worker (engine soft-zc, zc_buf=100): buffer size must be a positive multiple " \
           "of 64, got 100" in f.reason
    assert "died" not in f.reason


def test_worker_killed_by_a_signal_says_which(srv):
    def kill_rx(placed):
        os.kill(placed[0].rx_pid, signal.SIGKILL)

    res = run(ClientOptions(src=srv.address, dst=srv.address, duration=2.0, on_started=kill_rx))
    assert "rx worker died (killed by SIGKILL)" in res.flows[0].reason


# ---- leftovers ---------------------------------------------------------------------------------

@pytest.fixture
def short_tmpdir(monkeypatch) -> Iterator[Path]:
    """A TMPDIR of this test's own (short: the forkserver's Unix socket path lives below it)."""
    tmp = Path(tempfile.mkdtemp(prefix="zt-"))
    monkeypatch.setenv("TMPDIR", str(tmp))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def _temp_leftovers(tmp: Path) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*")
                  if p.name.startswith(("pymp-", "zcnet-server-")))


def test_sigkilled_server_leaves_no_multiprocessing_temp_dirs_after_the_next_start(
        tmp_path, short_tmpdir, no_leaks):
    tmp = short_tmpdir
    logs = tmp_path / "logs"
    logs.mkdir()
    with server(logs, "127.0.0.1") as s:
        assert run(ClientOptions(src=s.address, dst=s.address, duration=0.2)).summary.ok == 1
        assert any(p.startswith("zcnet-server-") and "pymp-" in p for p in _temp_leftovers(tmp))
        s.proc.kill()
        s.proc.wait()
    killed = _temp_leftovers(tmp)
    assert any("pymp-" in p for p in killed), killed   # what SIGKILL leaves, until ...
    with server(logs, "127.0.0.1") as s2:   # ... the next server starts: it sweeps them
        now = _temp_leftovers(tmp)
        assert not set(killed) & set(now), now
        assert s2.proc.poll() is None
    assert _temp_leftovers(tmp) == []   # and a clean stop leaves nothing either


def test_sweep_leaves_a_live_servers_directory_alone(tmp_path, short_tmpdir, no_leaks):
    tmp = short_tmpdir
    with server(tmp_path, "127.0.0.1") as first:
        mine = [p for p in _temp_leftovers(tmp) if "/" not in p]
        assert len(mine) == 1
        with server(tmp_path, "127.0.0.1") as second:
            assert set(mine) < {p for p in _temp_leftovers(tmp) if "/" not in p}
            assert run(ClientOptions(src=first.address, dst=second.address,
                                     duration=0.2)).summary.ok == 1


# ---- numbers and hints of the server and client commands ---------------------------------------

@pytest.mark.parametrize("option,value", [
    ("--max-duration", "inf"), ("--max-duration", "nan"), ("--max-duration", "-1"),
    ("--max-duration", "1e9"), ("--session-timeout", "inf"), ("--session-timeout", "0"),
    ("--max-flows", "0"), ("--max-flows", "100000000"), ("--max-memory", "-5"),
])
def test_server_limits_out_of_range_are_usage_errors(option, value):
    out = _cli("server", "--listen", "127.0.0.1:0", option, value)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert option in out.stderr and READY not in out.stdout


def _main_rc(capsys, argv: list[str]) -> tuple[int, str]:
    from zcnet.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:   # argparse's own refusals
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


_NONSENSE_FLOATS = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e400", "-0.0", "1e7"])


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(["--session-timeout", "--max-duration", "--max-flows",
                               "--max-memory"]),
       value=_NONSENSE_FLOATS | st.integers(max_value=0).map(str)
       | st.integers(min_value=(1 << 40) + 1).map(str))
def test_fuzz_server_numeric_options_refuse_nonsense(capsys, option, value):
    rc, err = _main_rc(capsys, ["server", "--listen", "127.0.0.1:0", option, value])
    assert rc == 2 and "Traceback" not in err and err.strip()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option=st.sampled_from(["-t", "-n", "--cpu-min", "--cpu-max", "--pin-off",
                               "--rx-app-cpu", "--tx-app-cpu", "--max-attempts", "--data-port",
                               "--read-size", "--write-size", "--req-size"]),
       value=_NONSENSE_FLOATS | st.integers(max_value=-1).map(str)
       | st.integers(min_value=1 << 41).map(str))
def test_fuzz_client_numeric_options_refuse_nonsense(capsys, tmp_path, option, value):
    assume(not (value == "0" and option in ("--cpu-min", "--cpu-max", "--pin-off",
                                            "--rx-app-cpu", "--tx-app-cpu")))  # CPU 0 is real
    token = tmp_path / "token"
    if not token.exists():
        token.write_text("correct horse battery staple\n")
        token.chmod(0o600)
    # Refused before any connection (one would fail with rc 1: nothing listens on port 9).
    rc, err = _main_rc(capsys, ["client", "--src", "127.0.0.1:9", "--token-file", str(token),
                                option, value])
    assert rc == 2 and "Traceback" not in err and err.strip(), (rc, err)


def test_sweep_removes_only_directories_whose_owner_is_gone(tmp_path, monkeypatch):
    import fcntl

    from zcnet.bench import scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dirs = {name: tmp_path / f"{scratch.PREFIX}{name}" for name in
            ("held", "free", "unlocked-new", "unlocked-old")}
    for d in dirs.values():
        d.mkdir(mode=0o700)
        (d / "pymp-x").mkdir()
    for name in ("held", "free"):
        (dirs[name] / scratch.LOCK).touch()
    fd = os.open(dirs["held"] / scratch.LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)   # a live server's lock
        old = os.stat(dirs["unlocked-old"]).st_mtime - scratch.STALE - 60
        os.utime(dirs["unlocked-old"], (old, old))
        removed = scratch.sweep()
    finally:
        os.close(fd)
    assert sorted(removed) == sorted([dirs["free"], dirs["unlocked-old"]])
    assert dirs["held"].exists() and dirs["unlocked-new"].exists()
