"""``--ssh HOST``: remote start and stop of a server, against a fake ``ssh`` that runs the remote
command locally (no ssh server is reachable here). What is tested is ours: the command line, the
token on stdin, readiness, and that closing the connection stops the server."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from zcnet.bench.client import ClientOptions, run
from zcnet.bench.remote import RemoteServer
from zcnet.errors import ZcnetError

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaks")]

# Options with an argument, as ssh parses them; then the host, then "--", then the command.
FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l|-F|-J) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
echo "$1" > "$(dirname "$0")/host"
shift
[ "$1" = "--" ] && shift
exec sh -c "$*"
"""

BROKEN_SSH = """#!/bin/sh
echo "ssh: connect to host $3 port 22: Connection refused" >&2
exit 255
"""


def script(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    p.chmod(0o755)
    return str(p)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_command_line_is_ssh_host_then_one_quoted_command():
    r = RemoteServer("lab-b", port=1234, listen="::", python="/opt/py 3/bin/python",
                     server_args=("--max-flows", "8"))
    argv = r.command()
    assert argv[0] == "ssh" and "BatchMode=yes" in argv
    assert argv[argv.index("--") - 1] == "lab-b"
    remote = shlex.split(argv[-1])
    assert remote[:4] == ["/opt/py 3/bin/python", "-m", "zcnet", "server"]
    assert remote[remote.index("--listen") + 1] == "[::]:1234"
    assert remote[remote.index("--token-file") + 1] == "-"
    assert "--exit-on-eof" in remote and remote[-2:] == ["--max-flows", "8"]
    # The token is never on a command line.
    assert r.token.decode() not in " ".join(argv)


def test_remote_server_lifecycle(no_leaks, tmp_path):
    ssh = script(tmp_path, "ssh", FAKE_SSH)
    port = free_port()
    remote = RemoteServer("127.0.0.1", port=port, listen="127.0.0.1", ssh=ssh,
                          python=sys.executable)
    with remote:
        assert remote.address == f"127.0.0.1:{port}"
        assert (tmp_path / "host").read_text().strip() == "127.0.0.1"
        cmdline = Path(f"/proc/{remote.proc.pid}/cmdline").read_bytes()
        assert remote.token not in cmdline
        addr = remote.address
        with pytest.raises(ZcnetError, match="authentication failed"):
            run(ClientOptions(src=addr, dst=addr, duration=0.2, token=b"not the token"))
        res = run(ClientOptions(src=addr, dst=addr, duration=0.3, token=remote.token))
        assert res.flows[0].status == "ok" and (res.flows[0].bytes or 0) > 0
        proc = remote.proc
    # Leaving the block closed stdin; the server exited by itself, cleanly.
    assert proc.returncode == 0
    assert refused(port)


def test_ssh_failure_is_reported_with_its_message(no_leaks, tmp_path):
    ssh = script(tmp_path, "ssh", BROKEN_SSH)
    with pytest.raises(ZcnetError, match="Connection refused"):
        RemoteServer("nohost", ssh=ssh, port=free_port()).start()


def test_cli_client_with_ssh(no_leaks, tmp_path):
    ssh = script(tmp_path, "ssh", FAKE_SSH)
    port = free_port()
    out = tmp_path / "client.json"
    csv = tmp_path / "client.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "zcnet", "client", "--ssh", "127.0.0.1", "--ssh-cmd", ssh,
         "--ssh-port", str(port), "--ssh-listen", "127.0.0.1", "--ssh-python", sys.executable,
         "-t", "0.3", "--rr", "--req-size", "64", "--json", str(out), "--csv", str(csv)],
        capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["kind"] == "client" and doc["tool"] == "zcnet"
    # Both servers' environments travel with the results (here both are this machine).
    assert doc["env"]["servers"]["dst"]["kernel"] == os.uname().release
    (flow,) = doc["results"]
    assert flow["status"] == "ok" and flow["transactions"] > 0
    assert doc["summary"]["p50_us"] > 0
    header, row = csv.read_text().splitlines()
    assert "tcp_tx.retrans" in header.split(",") and row.startswith("0,")
    assert "p50 us" in proc.stdout
    assert refused(port)


def test_cli_client_unreachable_server_is_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "zcnet", "client", "--src",
                           f"127.0.0.1:{free_port()}", "-t", "0.2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "cannot reach zcnet server" in proc.stderr and "Traceback" not in proc.stderr
