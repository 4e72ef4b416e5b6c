"""The control protocol state machine, driven with bytes only (no sockets)."""

from __future__ import annotations

import json
import struct

import pytest

from zcnet.bench import proto as p
from zcnet.bench.proto import (
    NEED_DATA,
    Connection,
    Limits,
    LocalProtocolError,
    RemoteProtocolError,
    Role,
)

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")

TOKEN = b"s3cret"
OPEN = {"type": "open", "flow": 0, "mode": "stream", "engine": "epoll", "read_size": 65536,
        "req_size": 1, "resp_size": 1}
CONNECT = {"type": "connect", "flow": 0, "host": "127.0.0.1", "port": 5000, "mode": "stream",
           "tx": "send", "write_size": 65536, "req_size": 1, "resp_size": 1}


def deliver(src: Connection, dst: Connection, msg: dict) -> dict:
    dst.receive_data(src.send(msg))
    event = dst.next_event()
    assert event is not NEED_DATA
    return event


def welcome(challenge: str) -> dict:
    return {"type": "welcome", "version": p.PROTOCOL_VERSION, "caps": list(p.CAPABILITIES),
            "challenge": challenge, "cpus": 2, "limits": Limits().to_wire()}


def handshake(limits: Limits | None = None) -> tuple[Connection, Connection]:
    cli, srv = Connection(Role.CLIENT), Connection(Role.SERVER, limits)
    deliver(cli, srv, {"type": "hello", "version": p.PROTOCOL_VERSION, "caps": ["stream"]})
    chal = p.new_challenge()
    got = deliver(srv, cli, welcome(chal))
    mac = p.auth_mac(TOKEN, got["challenge"])
    auth = deliver(cli, srv, {"type": "auth", "mac": mac})
    assert p.check_mac(TOKEN, chal, auth["mac"])
    deliver(srv, cli, {"type": "auth_ok"})
    assert cli.state == srv.state == "ready"
    return cli, srv


def test_full_conversation_walks_both_sides_through_the_same_states():
    cli, srv = handshake()
    assert deliver(cli, srv, OPEN)["flow"] == 0
    assert srv.state == cli.state == "open"
    deliver(srv, cli, {"type": "opened", "flow": 0, "port": 40000, "pid": 123})
    deliver(cli, srv, CONNECT)
    deliver(srv, cli, {"type": "connected", "flow": 0, "pid": 124, "cpu": 1, "local_port": 4})
    deliver(cli, srv, {"type": "probe", "flow": 0})
    deliver(srv, cli, {"type": "probed", "flow": 0, "cpu": 1})
    deliver(cli, srv, {"type": "pin", "flow": 0, "cpu": 0})
    deliver(srv, cli, {"type": "pinned", "flow": 0, "cpu": 0})
    assert deliver(cli, srv, {"type": "start", "duration": 2})["duration"] == 2.0
    assert srv.state == "running"
    deliver(srv, cli, {"type": "results", "flows": [{"flow": 0, "role": "rx"}], "cpus": {},
                       "seconds": 2.0})
    deliver(cli, srv, {"type": "end"})
    deliver(srv, cli, {"type": "bye"})
    assert cli.closed and srv.closed


def test_wrong_token_does_not_verify():
    chal = p.new_challenge()
    assert not p.check_mac(TOKEN, chal, p.auth_mac(b"other", chal))
    assert not p.check_mac(TOKEN, chal, p.auth_mac(TOKEN, p.new_challenge()))
    assert p.check_mac(b"", chal, p.auth_mac(b"", chal))


def test_frames_split_at_every_byte_reassemble():
    cli, srv = Connection(Role.CLIENT), Connection(Role.SERVER)
    wire = cli.send({"type": "hello", "version": p.PROTOCOL_VERSION, "caps": []})
    for b in wire[:-1]:
        srv.receive_data(bytes([b]))
        assert srv.next_event() is NEED_DATA
    srv.receive_data(wire[-1:])
    assert srv.next_event()["type"] == "hello"


@pytest.mark.parametrize(("payload", "code"), [
    (b"{", "malformed"),
    (b"\xff\xfe", "malformed"),
    (b"[1, 2]", "malformed"),
    (b'{"type": "nope"}', "unknown"),
    (b'{"type": "hello", "version": 1}', "invalid"),
    (b'{"type": "hello", "version": true, "caps": []}', "invalid"),
    (b'{"type": "hello", "version": 1, "caps": [], "x": 1}', "invalid"),
    (b'{"type": "hello", "version": 1, "caps": ["BAD CAP"]}', "invalid"),
    (b'{"type": "hello", "version": NaN, "caps": []}', "malformed"),
    (b'{"type": "hello", "version": 99, "caps": []}', "version"),
    (b'{"type": "start", "duration": 1}', "unexpected"),
    (b"[" * 2000 + b"]" * 2000, "malformed"),  # deep, within MAX_PREAUTH_MESSAGE
    (b"[" * 100000 + b"]" * 100000, "too_big"),   # before auth, frames are small
])
def test_invalid_input_names_its_error(payload, code):
    srv = Connection(Role.SERVER)
    srv.receive_data(struct.pack("!I", len(payload)) + payload)
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == code


def test_oversized_frame_is_refused_from_its_header():
    srv = Connection(Role.SERVER)
    srv.receive_data(struct.pack("!I", p.MAX_MESSAGE + 1))
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == "too_big"


def test_eof_mid_frame_closes():
    srv = Connection(Role.SERVER)
    srv.receive_data(struct.pack("!I", 10) + b"{")
    srv.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == "eof" and srv.closed


@pytest.mark.parametrize(("msg", "limits", "code"), [
    ({**OPEN, "read_size": 2 << 20}, Limits(max_buffer=1 << 20), "limit"),
    ({**OPEN, "read_size": 1 << 20}, Limits(max_memory=1 << 19), "limit"),
    ({"type": "start", "duration": 11.0}, Limits(max_duration=10), "limit"),
    ({**OPEN, "flow": 1 << 17}, None, "invalid"),
    ({**CONNECT, "host": "a b"}, None, "invalid"),
    ({**CONNECT, "port": 0}, None, "invalid"),
    ({**OPEN, "mode": "udp"}, None, "invalid"),
    ({**OPEN, "engine_opts": {"zc_area": 2 << 20}}, Limits(max_buffer=1 << 20), "limit"),
    ({**OPEN, "engine_opts": {"mshot_buf": 1 << 16, "mshot_entries": 1 << 10}},
     Limits(max_buffer=1 << 25, max_memory=1 << 25), "limit"),
    ({**OPEN, "engine_opts": {"ifname": "eth0; rm -rf /"}}, None, "invalid"),
    ({**OPEN, "engine_opts": {f"k{i}": 1 for i in range(17)}}, None, "invalid"),
    ({"type": "start", "duration": -1}, None, "invalid"),
])
def test_server_enforces_bounds(msg, limits, code):
    _cli, srv = handshake(limits)
    # The client side checks shape but not the server's limits; build the frame by hand anyway so
    # the server is tested against a peer that checks nothing.
    payload = json.dumps(msg).encode()
    srv.receive_data(struct.pack("!I", len(payload)) + payload)
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == code


def test_an_engine_option_may_list_queues():
    """devmem's queues=1,2 (one binding over both) passes; what a shell would read does not."""
    cli, srv = handshake()
    opts = {"ifname": "eth1", "queues": "1,2"}
    assert deliver(cli, srv, {**OPEN, "engine_opts": opts})["engine_opts"] == opts


def test_flow_limit_counts_flows_not_messages():
    cli, srv = handshake(Limits(max_flows=2))
    for flow in (0, 1):
        deliver(cli, srv, {**OPEN, "flow": flow})
        deliver(srv, cli, {"type": "opened", "flow": flow, "port": 1, "pid": 1})
        # open + connect of the same flow is one flow (src and dst served by one server).
        deliver(cli, srv, {**CONNECT, "flow": flow})
        deliver(srv, cli, {"type": "connected", "flow": flow, "pid": 1, "cpu": 0, "local_port": 1})
    assert srv.flows == 2
    with pytest.raises(RemoteProtocolError, match="flows"):
        deliver(cli, srv, {**OPEN, "flow": 2})


def test_close_releases_the_flow_for_reuse():
    cli, srv = handshake(Limits(max_flows=1))
    for _ in range(3):
        deliver(cli, srv, OPEN)
        deliver(srv, cli, {"type": "opened", "flow": 0, "port": 1, "pid": 1})
        deliver(cli, srv, {"type": "close", "flow": 0})
        deliver(srv, cli, {"type": "closed", "flow": 0})
    assert srv.flows == 0


def test_duplicate_flow_is_refused():
    cli, srv = handshake()
    deliver(cli, srv, OPEN)
    deliver(srv, cli, {"type": "opened", "flow": 0, "port": 1, "pid": 1})
    with pytest.raises(RemoteProtocolError, match="already exists"):
        deliver(cli, srv, OPEN)


def test_local_side_refuses_out_of_order_sends():
    cli = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        cli.send({"type": "start", "duration": 1.0})
    with pytest.raises(LocalProtocolError):
        cli.send({"type": "hello", "version": 1})          # missing caps
    srv = Connection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        srv.send({"type": "hello", "version": 1, "caps": []})   # clients say hello


def test_error_closes_from_any_state_and_is_delivered():
    cli, srv = handshake()
    deliver(cli, srv, OPEN)
    got = deliver(srv, cli, {"type": "error", "code": "unsupported", "message": "no engine"})
    assert got["code"] == "unsupported" and cli.closed and srv.closed
    with pytest.raises(LocalProtocolError):
        cli.send({"type": "end"})


def test_every_state_is_reachable_and_every_request_has_a_reply():
    reachable = {"hello"}
    frontier = ["hello"]
    while frontier:
        state = frontier.pop()
        for (s, _, _), nxt in p.TRANSITIONS.items():
            if s == state and nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == p.STATES
    for request, reply in p.REQUESTS.items():
        assert request in p.SCHEMA and reply in p.SCHEMA
    assert {k for _, _, k in p.TRANSITIONS} | {"error"} == set(p.SCHEMA)


def test_oversized_reply_is_refused_on_our_side():
    cli, srv = handshake()
    deliver(cli, srv, {"type": "start", "duration": 1.0})
    big = [{"flow": i, "role": "rx", "reason": "x" * 1000} for i in range(1100)]
    with pytest.raises(LocalProtocolError) as exc:
        srv.send({"type": "results", "flows": big, "cpus": {}, "seconds": 1.0})
    assert exc.value.code == "too_big" and srv.state == "running"


# ---- buffer accounting, number bounds, results shapes --------------------------------------------

def _frame(payload: str) -> bytes:
    raw = payload.encode()
    return p.HEADER.pack(len(raw)) + raw


def test_huge_integer_in_a_float_field_is_a_protocol_error_not_overflow():
    _, srv = handshake()
    srv.receive_data(_frame('{"type":"start","duration":1' + "0" * 400 + "}"))
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == "invalid"


def _open_refused(limits: Limits, msg: dict) -> str:
    """The error code a server with ``limits`` refuses the open ``msg`` with."""
    _, srv = handshake(limits)
    cli = Connection(Role.CLIENT)
    cli.state = "ready"
    srv.receive_data(cli.send(msg))
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    return exc.value.code


def test_provided_buffer_ring_entries_alone_count_against_session_memory():
    # mshot_entries without mshot_buf still allocates entries x the default 64 KiB buffer.
    msg = {**OPEN, "engine": "uring-mshot", "engine_opts": {"mshot_entries": 32768}}
    assert _open_refused(Limits(max_memory=64 << 20), msg) == "limit"


def test_flows_end_with_their_run_so_a_session_can_run_again():
    cli, srv = handshake(Limits(max_flows=1))
    for _ in range(2):
        deliver(cli, srv, OPEN)
        deliver(srv, cli, {"type": "opened", "flow": 0, "port": 40000, "pid": 123})
        deliver(cli, srv, {"type": "start", "duration": 0.1})
        deliver(srv, cli, {"type": "results", "flows": [], "cpus": {}, "seconds": 0.1})
        assert srv.flows == cli.flows == 0


@pytest.mark.parametrize("flows", [[1], [{"role": "rx"}], [{"flow": "0", "role": "rx"}]])
def test_results_flows_are_objects_with_a_flow_and_role(flows):
    cli, srv = handshake()
    deliver(cli, srv, {"type": "start", "duration": 0.1})
    cli.receive_data(_frame(json.dumps({"type": "results", "flows": flows, "cpus": {},
                                          "seconds": 0.1})))
    with pytest.raises(RemoteProtocolError):
        cli.next_event()


def test_results_cpus_are_objects():
    cli, srv = handshake()
    deliver(cli, srv, {"type": "start", "duration": 0.1})
    cli.receive_data(_frame('{"type":"results","flows":[],"cpus":{"0":1},"seconds":0.1}'))
    with pytest.raises(RemoteProtocolError):
        cli.next_event()


@pytest.mark.parametrize("engine, opts", [
    ("uring-mshot", None),                     # default ring: 256 x 64 KiB = 16 MiB
    ("soft-zc", None),                         # default area: 16 x 1 MiB
    ("soft-zc", {"zc_buf": 4 << 20}),          # area follows the buffer size: 64 MiB
])
def test_engine_default_memory_counts_against_session_memory(engine, opts):
    msg = {**OPEN, "engine": engine, **({"engine_opts": opts} if opts else {})}
    assert _open_refused(Limits(max_memory=8 << 20), msg) == "limit"
