"""Review findings in the control protocol, driven with bytes only."""

from __future__ import annotations

import json

import pytest

from test_proto_state import OPEN, deliver, handshake
from zcnet.bench import proto as p
from zcnet.bench.proto import Connection, Limits, RemoteProtocolError, Role

# Everything a test here creates must be gone afterwards (see leaks.py).
pytestmark = pytest.mark.usefixtures("no_leaks")


def _frame(payload: str) -> bytes:
    raw = payload.encode()
    return p.HEADER.pack(len(raw)) + raw


def test_huge_integer_in_a_float_field_is_a_protocol_error_not_overflow():
    _, srv = handshake()
    srv.receive_data(_frame('{"type":"start","duration":1' + "0" * 400 + "}"))
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == "invalid"


def test_provided_buffer_ring_entries_alone_count_against_session_memory():
    # mshot_entries without mshot_buf still allocates entries x the default 64 KiB buffer.
    _, srv = handshake(Limits(max_memory=64 << 20))
    msg = {**OPEN, "engine": "uring-mshot", "engine_opts": {"mshot_entries": 32768}}
    cli = Connection(Role.CLIENT)
    cli.state = "ready"
    srv.receive_data(cli.send(msg))
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == "limit"


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
    _, srv = handshake(Limits(max_memory=8 << 20))
    msg = {**OPEN, "engine": engine, **({"engine_opts": opts} if opts else {})}
    cli = Connection(Role.CLIENT)
    cli.state = "ready"
    srv.receive_data(cli.send(msg))
    with pytest.raises(RemoteProtocolError) as exc:
        srv.next_event()
    assert exc.value.code == "limit"
