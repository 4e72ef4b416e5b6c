"""What the zcnet.aio examples share: the command line around a service and how it is run.

Each example is either a self-test on loopback (the default) or a server (``--listen``), on
the default asyncio loop or on uvloop (``--uvloop``, from zcnet's ``aio`` extra: ``pip install
'zcnet[aio]'``); Ctrl-C ends it quietly, and a zcnet error or a missing uvloop is printed as one
line, not a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from zcnet.errors import ZcnetError


def parser(doc: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--listen", help="HOST:PORT to serve on (default: self-test on loopback)")
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop")
    return ap


def run(args: argparse.Namespace, serve: Callable[[str, int], Coroutine[Any, Any, Any]],
        self_test: Callable[[], Coroutine[Any, Any, Any]]) -> None:
    """``serve(host, port)`` with ``--listen``, else ``self_test()``, on the chosen loop."""
    if args.listen:
        host, _, port = args.listen.rpartition(":")
        coro = serve(host, int(port))
    else:
        coro = self_test()
    runner: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    if args.uvloop:
        try:
            import uvloop
        except ImportError:
            coro.close()  # never started: no "was never awaited" warning
            raise SystemExit("error: --uvloop needs uvloop, which is not installed; "
                             "install zcnet's aio extra: pip install 'zcnet[aio]'") from None
        runner = uvloop.run
    try:
        with contextlib.suppress(KeyboardInterrupt):
            runner(coro)
    except ZcnetError as e:
        raise SystemExit(f"error: {e}") from None
