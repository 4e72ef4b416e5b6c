"""Issue 33: a client run beyond a server's limits (flows, duration, buffers, session memory) is
refused before any flow starts, naming the limit; the server still refuses on its own side.
The client learns the limits from the server's welcome (sans-I/O, tested with bytes only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_proto_state import TOKEN, welcome

from refusals import refusal, run_main
from server_util import ServerProc, flow_workers, server
from zcnet.bench import proto
from zcnet.bench.control import Control, ServerRefused
from zcnet.bench.proto import Connection, Limits, RemoteProtocolError, Role

LIMITS = Limits(max_duration=5.0, max_flows=2, max_buffer=64 << 20, max_memory=8 << 20)


# --- the client learns the limits (no sockets) ------------------------------------------------


def test_client_connection_takes_the_limits_from_the_welcome() -> None:
    cli = Connection(Role.CLIENT)
    assert cli.limits == Limits()   # until a server says otherwise
    cli.send({"type": "hello", "version": proto.PROTOCOL_VERSION, "caps": ["stream"]})
    cli.receive_data(proto.encode({**welcome(proto.new_challenge()),
                                   "limits": LIMITS.to_wire()}))
    assert cli.next_event()["type"] == "welcome"
    assert cli.limits == LIMITS and cli.budget.limits == LIMITS


@pytest.mark.parametrize(("limits", "why"), [
    ({"max_duration": 5.0, "max_flows": 2, "max_buffer": 1}, "missing 'max_memory'"),
    ({**LIMITS.to_wire(), "max_flows": "2"}, "max_flows: wrong type str"),
    ({**LIMITS.to_wire(), "max_flows": 0}, "max_flows: 0 outside"),
    ({**LIMITS.to_wire(), "max_duration": True}, "max_duration: wrong type bool"),
    ({**LIMITS.to_wire(), "max_memory": -1}, "max_memory: -1 outside"),
    ([1, 2], "welcome.limits: wrong type list"),
])
def test_a_welcome_with_unusable_limits_is_a_protocol_error(limits: Any, why: str) -> None:
    cli = Connection(Role.CLIENT)
    cli.send({"type": "hello", "version": proto.PROTOCOL_VERSION, "caps": ["stream"]})
    cli.receive_data(proto.encode({**welcome(proto.new_challenge()), "limits": limits}))
    with pytest.raises(RemoteProtocolError, match=why):
        cli.next_event()


def test_newer_limit_fields_are_ignored() -> None:
    cli = Connection(Role.CLIENT)
    cli.send({"type": "hello", "version": proto.PROTOCOL_VERSION, "caps": ["stream"]})
    cli.receive_data(proto.encode({**welcome(proto.new_challenge()),
                                   "limits": {**LIMITS.to_wire(), "max_cpus": 3}}))
    cli.next_event()
    assert cli.limits == LIMITS


# --- against a real server -------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProc, Path]]:
    tmp = tmp_path_factory.mktemp("limits")
    token = tmp / "token"
    token.write_bytes(TOKEN + b"-and-more\n")
    token.chmod(0o600)
    with server(tmp, "127.0.0.1", "--token-file", str(token),
                "--max-flows", str(LIMITS.max_flows), "--max-duration",
                str(LIMITS.max_duration), "--max-memory", str(LIMITS.max_memory)) as s:
        yield s, token


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The types of the requests the client sends to servers."""
    types: list[str] = []
    real = Control.request

    def request(self: Control, msg: dict[str, Any]) -> dict[str, Any]:
        types.append(msg["type"])
        return real(self, msg)

    monkeypatch.setattr(Control, "request", request)
    return types


@pytest.mark.parametrize(("argv", "needles"), [
    (["-n", "3"], ["-n 3", "allows at most 2 flows per session",
                   "use -n 2 or fewer", "--max-flows"]),
    (["-n", "2", "-t", "6"], ["-t 6", "runs of at most 5 s", "use -t 5 or less",
                              "--max-duration"]),
    (["-n", "2", "--read-size", "4M", "--write-size", "4M"],
     ["2 flow(s) need 16777224 bytes of buffers", "allows 8388608 bytes per session",
      "--read-size", "--max-memory"]),
    (["--rx-engine", "uring-mshot", "--rx-opt", "mshot_buf=1048576",
      "--rx-opt", "mshot_entries=128"],
     ["a buffer of 134217728 bytes", "at most 67108864 bytes per buffer", "area/ring"]),
])
def test_client_beyond_the_limits_is_refused_before_any_flow(
        limited: tuple[ServerProc, Path], sent: list[str], argv: list[str],
        needles: list[str], no_leaks: None) -> None:
    s, token = limited
    logged = len(s.log_text())
    rc, _, err = run_main("client", "--src", s.address, "--token-file", str(token),
                          "-t", "1", *argv)
    refusal(rc, err, 2, s.address, *needles)
    assert sent == []                 # not one open, connect or start
    assert flow_workers(s.proc.pid) == []
    assert "WARNING" not in s.log_text()[logged:]   # the server never had to refuse


def test_client_within_the_limits_runs(limited: tuple[ServerProc, Path], sent: list[str],
                                       tmp_path: Path, no_leaks: None) -> None:
    s, token = limited
    rc, out, err = run_main("client", "--src", s.address, "--token-file", str(token),
                            "-n", "2", "-t", "0.2")
    assert rc == 0, err
    assert "over 2/2 flows" in out
    assert sent.count("open") == sent.count("connect") == 2


def test_server_refuses_beyond_its_limits_on_its_own(limited: tuple[ServerProc, Path],
                                                    no_leaks: None) -> None:
    """A client that does not check (an older one, or a hand-made one) meets the server's own
    refusal at the first request beyond the limit."""
    s, token = limited
    control = Control(s.address, token.read_bytes().strip())
    try:
        for flow in range(LIMITS.max_flows + 1):
            msg = {"type": "open", "flow": flow, "mode": "stream", "engine": "epoll",
                   "read_size": 4096, "req_size": 1, "resp_size": 1}
            if flow < LIMITS.max_flows:
                control.request(msg)
                continue
            with pytest.raises(ServerRefused, match="more than 2 flows") as refused:
                control.request(msg)
            assert refused.value.code == "limit"
    finally:
        control.close()


@pytest.mark.parametrize("limited_side", ["src", "dst"])
def test_each_server_of_a_run_is_held_to_its_own_limits(
        limited: tuple[ServerProc, Path], sent: list[str], tmp_path: Path,
        limited_side: str, no_leaks: None) -> None:
    """Flows open on dst and connect from src: whichever of the two allows fewer is named."""
    s, token = limited
    with server(tmp_path, "127.0.0.2", "--token-file", str(token)) as roomy:
        ends = {"src": roomy.address, "dst": roomy.address, limited_side: s.address}
        rc, _, err = run_main("client", "--src", ends["src"], "--dst", ends["dst"],
                              "--token-file", str(token), "-n", "3", "-t", "1")
    refusal(rc, err, 2, f"the server at {s.address} allows at most 2 flows")
    assert sent == []
