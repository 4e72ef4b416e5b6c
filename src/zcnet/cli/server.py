"""``zcnet server``: run the control daemon a ``zcnet client`` drives."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from zcnet.bench.authtoken import default_token_path, read_token, token_from_stream
from zcnet.bench.endpoint import parse_hostport
from zcnet.bench.proto import Limits
from zcnet.cli._args import Subparsers, number
from zcnet.errors import UsageError

log = logging.getLogger(__name__)


def register(sub: Subparsers) -> None:
    p = sub.add_parser("server", help="run the daemon that zcnet client drives (kperf-style)",
                       description="Serve benchmark sessions: each authenticated control "
                       "connection may open flows, pin their workers and run them. Listens on "
                       "127.0.0.1:18323 by default. Without --token-file the secret is this "
                       "user's token file (~/.config/zcnet/token, created on first use), which "
                       "`zcnet client` of the same user reads; any address beyond loopback "
                       "requires --token-file.")
    p.add_argument("--listen", default="127.0.0.1:18323", metavar="ADDR:PORT",
                   help="control address (default 127.0.0.1:18323; port 0 picks a free one)")
    p.add_argument("--token-file", metavar="FILE",
                   help="shared secret for challenge-response auth (mode 600); '-' reads it "
                   "from the first line of stdin (default: this user's token file)")
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
    if path is None:
        return None   # the server uses this user's token file
    if path == "-":
        return token_from_stream(sys.stdin.buffer, "stdin")
    return read_token(path)


# One range per quantity; the wire protocol's own bounds where it has them (start.duration,
# flow numbers), so that nothing the server allows is refused by its own protocol.
_LIMITS: tuple[tuple[str, str, float, float], ...] = (
    ("session_timeout", "--session-timeout", 0.1, 86400.0),
    ("max_duration", "--max-duration", 0.01, 1e6),
    ("max_flows", "--max-flows", 1, 1 << 16),
    ("max_memory", "--max-memory", 1, 1 << 40),
)


def _check_limits(args: argparse.Namespace) -> None:
    for attr, option, lo, hi in _LIMITS:
        value = getattr(args, attr)
        # "not lo <= v <= hi" also refuses NaN, which compares False with everything.
        if not (math.isfinite(value) and lo <= value <= hi):
            raise UsageError(f"{option} {value}: out of range",
                             f"give a number from {lo:g} to {hi:g}")


def _watch_stdin(on_eof: Callable[[], None]) -> None:
    """Return-on-EOF reader: an ssh-started server's stdin ends when its client goes away."""
    while sys.stdin.buffer.read1(4096):
        pass
    log.info("stdin closed: stopping")
    on_eof()


def run(args: argparse.Namespace) -> int:
    _check_limits(args)
    # Imported here, not at the top: every `zcnet` command loads this module to build its
    # parser, and only `zcnet server` needs the server (sessions, workers, forkserver).
    from zcnet.bench.server import Server

    host, port = parse_hostport(args.listen)
    limits = Limits(max_duration=args.max_duration, max_flows=args.max_flows,
                    max_memory=args.max_memory)
    token_file = default_token_path()
    had_token = os.path.lexists(token_file)
    server = Server((host, port), token=_token(args.token_file), limits=limits,
                    session_timeout=args.session_timeout)
    if args.token_file is None:
        verb = "using" if had_token else "created"
        print(f"zcnet server: {verb} token file {token_file} (clients of this user read it; "
              "give others a copy, mode 600, as --token-file)", file=sys.stderr, flush=True)

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
