"""``zcnet server``: run the control daemon a ``zcnet client`` drives."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from zcnet.bench.protocol import Limits
from zcnet.cli._args import number
from zcnet.errors import UsageError

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("server", help="run the daemon that zcnet client drives (kperf-style)",
                       description="Serve benchmark sessions: each control connection may open "
                       "flows, pin their workers and run them. Listens on 127.0.0.1:18323 by "
                       "default; any other address requires --token-file.")
    p.add_argument("--listen", default="127.0.0.1:18323", metavar="ADDR:PORT",
                   help="control address (default 127.0.0.1:18323; port 0 picks a free one)")
    p.add_argument("--token-file", metavar="FILE",
                   help="shared secret for challenge-response auth; '-' reads it from the first "
                   "line of stdin")
    p.add_argument("--exit-on-eof", action="store_true",
                   help="exit when stdin closes (how an ssh-started server follows its client)")
    p.add_argument("--session-timeout", type=number("timeout"), default=60.0, metavar="S",
                   help="reap a session whose client is silent this long (default 60)")
    p.add_argument("--max-flows", type=number("flows"), default=Limits.max_flows, metavar="N")
    p.add_argument("--max-duration", type=number("duration"), default=Limits.max_duration,
                   metavar="S")
    p.add_argument("--max-memory", type=number("memory"), default=Limits.max_memory,
                   metavar="BYTES", help="sum of a session's buffers")
    p.set_defaults(func=run)


def _token(path: str | None) -> bytes | None:
    from zcnet.bench.server import read_token

    if path is None:
        return None
    if path == "-":
        token = sys.stdin.buffer.readline().strip()
        if len(token) < 8:
            raise UsageError("token on stdin is shorter than 8 bytes", "send a longer secret")
        return token
    return read_token(path)


def _watch_stdin(on_eof: Callable[[], None]) -> None:
    """Return-on-EOF reader: an ssh-started server's stdin ends when its client goes away."""
    while sys.stdin.buffer.read1(4096):
        pass
    log.info("stdin closed: stopping")
    on_eof()


def run(args: argparse.Namespace) -> int:
    from zcnet.bench.server import Server, parse_hostport

    # "not > 0" so that NaN (which compares False with everything) is refused too.
    if not all(v > 0 for v in (args.session_timeout, args.max_flows, args.max_duration,
                               args.max_memory)):
        raise UsageError("limits must be positive", "e.g. --session-timeout 30 --max-flows 64")
    host, port = parse_hostport(args.listen)
    limits = Limits(max_duration=args.max_duration, max_flows=args.max_flows,
                    max_memory=args.max_memory)
    server = Server((host, port), token=_token(args.token_file), limits=limits,
                    session_timeout=args.session_timeout)

    def on_term(signum: int, frame: FrameType | None) -> None:
        server.stop()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    if args.exit_on_eof:
        threading.Thread(target=_watch_stdin, args=(server.stop,), daemon=True,
                         name="zcnet-stdin").start()
    print(f"zcnet server listening on {server.address}", flush=True)
    server.serve_forever()
    return 0
