"""Fuzzing the control protocol decoder: whatever arrives, only ProtocolError escapes.

Hypothesis draws a seed input and a seed for a random generator; each example then decodes a
batch of mutations of it (byte flips, truncations, splices, wrong-typed fields), so > 100k decoder
inputs run in seconds: 800 examples x 64 byte-level inputs, each decoded raw and framed (102,400),
+ 800 x 48 field-level messages (38,400) + 300 x 32 split streams (9,600) = 150,400 inputs.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_util import server
from zcnet.bench import proto as p
from zcnet.bench.client import ClientOptions, run
from zcnet.bench.proto import NEED_DATA, Connection, Decoder, ProtocolError, Role

FAST = settings(max_examples=800, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
# A seed, not st.randoms(): every draw from st.randoms() is a hypothesis choice, far too slow for
# batches of inputs; hypothesis still explores and replays the seeds.
SEEDS = st.integers(0, 2**32 - 1)


def drain(dec: Decoder) -> int:
    """Decode until more data is needed or an error; return how many messages came out."""
    n = 0
    while True:
        try:
            msg = dec.next()
        except ProtocolError:
            return n
        if msg is NEED_DATA:
            return n
        assert isinstance(msg, dict) and msg["type"] in p.SCHEMA
        n += 1


def frame(payload: bytes) -> bytes:
    return struct.pack("!I", len(payload)) + payload


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[i % len(b)] = rng.randrange(256)
        elif op == 1:
            del b[i:]
        elif op == 2:
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        else:
            b[i:i] = b[: rng.randint(0, 16)]
    return bytes(b)


GOOD = [p.encode(m) for m in (
    {"type": "hello", "version": p.PROTOCOL_VERSION, "caps": ["stream"]},
    {"type": "open", "flow": 3, "mode": "rr", "engine": "epoll", "read_size": 4096,
     "req_size": 1, "resp_size": 1},
    {"type": "start", "duration": 1.5},
    {"type": "error", "code": "limit", "message": "x"},
)]


@FAST
@given(st.binary(max_size=64), SEEDS)
def test_byte_level_inputs_never_escape(blob, seed):
    rng = random.Random(seed)
    for i in range(64):
        data = mutate(rng, blob if i % 2 else rng.choice(GOOD))
        dec = Decoder()
        dec.feed(data)
        drain(dec)
        dec = Decoder()
        dec.feed(frame(data))
        drain(dec)


POOL = [None, True, False, 0, -1, 1, 2**31, 2**64, 2**70, 1.5, -0.0, 1e308, "", "a", "epoll",
        "stream", "127.0.0.1", "0" * 64, "x" * 5000, [], ["stream"], ["A B"], [1], {}, {"a": 1},
        {1: 2}, [[[]]], {"zc_area": 2**41}, {"mshot_buf": 65536, "mshot_entries": "x"},
        {"ifname": "eth0", "queue": 3, "zc_debug": True}, {"A": 1}, {"x": [1]}]
NAMES = sorted({f for spec in p.SCHEMA.values() for f in spec} | {"type", "extra"})


@FAST
@given(st.sampled_from(sorted(p.SCHEMA)), SEEDS)
def test_field_level_inputs_never_escape(kind, seed):
    rng = random.Random(seed)
    for _ in range(48):
        msg = {"type": kind}
        for name in p.SCHEMA[kind]:
            if rng.random() < 0.8:
                msg[name] = rng.choice(POOL)
        for _ in range(rng.randrange(3)):
            msg[rng.choice(NAMES)] = rng.choice(POOL)
        payload = json.dumps(msg).encode()
        # Straight into a server-role connection: framing, schema, transitions and limits.
        srv = Connection(Role.SERVER)
        srv.receive_data(frame(payload))
        with contextlib.suppress(ProtocolError):
            srv.next_event()


WIRE = b"".join(GOOD[:1]) + p.encode({"type": "auth", "mac": "0" * 64}) + p.encode(
    {"type": "end"})


@settings(max_examples=300, deadline=None, derandomize=True)
@given(SEEDS)
def test_any_split_reassembles(seed):
    rng = random.Random(seed)
    for _ in range(32):
        dec = Decoder()
        cuts = sorted(rng.randrange(len(WIRE) + 1) for _ in range(rng.randrange(6)))
        got, last = 0, 0
        for cut in [*cuts, len(WIRE)]:
            dec.feed(WIRE[last:cut])
            last = cut
            got += drain(dec)
        assert got == 3 and dec.pending == 0


# --- properties of valid traffic --------------------------------------------------------------
#
# Valid messages drawn from the schema's documented bounds, written out here (not derived from
# protocol.SCHEMA, so a wrong schema cannot agree with itself).
NAME = st.from_regex(r"[a-z][a-z0-9_-]{0,31}", fullmatch=True)
HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
HOST = st.from_regex(r"[0-9A-Za-z:.%_-]{1,40}", fullmatch=True)
SIZE = st.integers(1, 1 << 40)
FLOW = st.integers(0, 1 << 16)
OPT_VALUE = st.one_of(st.booleans(), st.integers(-(1 << 40), 1 << 40), HOST)
VALID = st.one_of(
    st.fixed_dictionaries({"type": st.just("hello"), "version": st.integers(0, 1 << 16),
                           "caps": st.lists(NAME, max_size=32)}),
    st.fixed_dictionaries({"type": st.just("auth"), "mac": HEX64}),
    st.fixed_dictionaries(
        {"type": st.just("open"), "flow": FLOW, "mode": st.sampled_from(["stream", "rr"]),
         "engine": NAME, "read_size": SIZE, "req_size": SIZE, "resp_size": SIZE},
        optional={"engine_opts": st.dictionaries(NAME, OPT_VALUE, max_size=16),
                  "verify": st.booleans(), "port": st.integers(1, 65535)}),
    st.fixed_dictionaries(
        {"type": st.just("connect"), "flow": FLOW, "host": HOST, "port": st.integers(1, 65535),
         "mode": st.sampled_from(["stream", "rr"]), "tx": NAME, "write_size": SIZE,
         "req_size": SIZE, "resp_size": SIZE}, optional={"verify": st.booleans()}),
    st.fixed_dictionaries({"type": st.just("pin"), "flow": FLOW, "cpu": st.integers(0, 1 << 16)},
                          optional={"role": st.sampled_from(["rx", "tx"])}),
    st.fixed_dictionaries({"type": st.just("start"),
                           "duration": st.floats(0.01, 1e6, allow_nan=False)}),
    st.fixed_dictionaries({"type": st.just("error"), "code": NAME,
                           "message": st.text(max_size=300)}),
    st.fixed_dictionaries(
        {"type": st.just("results"),
         "flows": st.lists(st.fixed_dictionaries(
             {"flow": FLOW, "role": st.sampled_from(["rx", "tx"])},
             optional={"status": st.sampled_from(["ok", "error"]),
                       "reason": st.text(max_size=20),
                       "bytes": st.integers(0, 1 << 40),
                       "seconds": st.floats(0.0, 1e6, allow_nan=False)}), max_size=4),
         "cpus": st.dictionaries(st.from_regex(r"[0-9]{1,4}", fullmatch=True),
                                 st.fixed_dictionaries({}, optional={
                                     k: st.floats(0.0, 100.0) for k in ("usr", "sys", "idle")}),
                                 max_size=3),
         "seconds": st.floats(0.0, 1e7, allow_nan=False)}),
    st.sampled_from([{"type": "end"}, {"type": "bye"}]),
)


def own_frame(msg: dict) -> bytes:
    """The wire format as documented (big-endian u32 length, then a JSON object), by hand."""
    return frame(json.dumps(msg).encode())


@settings(max_examples=400, deadline=None, derandomize=True)
@given(VALID)
def test_valid_messages_round_trip(msg):
    wire = p.encode(msg)
    (length,) = struct.unpack("!I", wire[:4])
    assert length == len(wire) - 4 and json.loads(wire[4:]) == msg  # encode says what it means
    dec = Decoder()
    dec.feed(wire)
    assert dec.next() == msg
    assert dec.next() is NEED_DATA and dec.pending == 0
    dec.feed(own_frame(msg))  # and the decoder reads the format, not only encode()'s spelling
    assert dec.next() == msg


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(VALID, min_size=1, max_size=6), SEEDS)
def test_a_truncated_stream_decodes_a_prefix_of_the_messages(msgs, seed):
    frames = [own_frame(m) for m in msgs]
    wire = b"".join(frames)
    ends = [sum(map(len, frames[:i + 1])) for i in range(len(frames))]
    rng = random.Random(seed)
    for cut in {0, len(wire), *(rng.randrange(len(wire) + 1) for _ in range(16))}:
        dec = Decoder()
        dec.feed(wire[:cut])
        got = []
        while (m := dec.next()) is not NEED_DATA:
            got.append(m)
        whole = sum(e <= cut for e in ends)
        assert got == msgs[:whole]
        assert dec.pending == cut - (ends[whole - 1] if whole else 0)
        dec.feed(wire[cut:])  # the rest completes the stream: nothing lost, nothing repeated
        while (m := dec.next()) is not NEED_DATA:
            got.append(m)
        assert got == msgs and dec.pending == 0


@pytest.mark.timeout(120)
def test_server_fed_fuzzed_sessions_still_serves_a_real_client(no_leaks, tmp_path):
    """The fuzzers' inputs, each as a session of its own against a real server: every reply the
    server gives is a valid message, and a real client is served afterwards."""
    rng = random.Random(16)
    hello = p.encode({"type": "hello", "version": p.PROTOCOL_VERSION, "caps": []})
    inputs = []
    for i in range(60):
        data = mutate(rng, rng.choice(GOOD))
        inputs.append(data if i % 3 else hello + mutate(rng, rng.choice(GOOD[1:])))
        if i % 4 == 0:
            inputs.append(frame(data))
    with server(tmp_path, "127.0.0.1") as srv:
        host, port = srv.address.rsplit(":", 1)
        for data in inputs:
            with socket.create_connection((host, int(port)), timeout=30) as c:
                c.sendall(data)
                c.shutdown(socket.SHUT_WR)
                dec, replies = Decoder(), []
                while chunk := c.recv(65536):
                    dec.feed(chunk)
                    while (m := dec.next()) is not NEED_DATA:  # a bad reply raises here
                        replies.append(m)
                assert dec.pending == 0
                assert all(r["type"] in ("welcome", "error") for r in replies), replies
        res = run(ClientOptions(src=srv.address, dst=srv.address, duration=0.2))
        assert res.flows[0].status == "ok"
        assert srv.proc.poll() is None and "Traceback" not in srv.log_text()
