"""The loop slice zcnet.aio declares (zcnet.aio.looptypes) is real: every method a protocol names
exists on each loop and future zcnet.aio runs with (asyncio's, uvloop's, zcnet's trio loop)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from zcnet.aio import looptypes
from zcnet.aio.backend import TrioEvent, TrioFuture, TrioLoop, TrioTimer


def _methods(protocol: type) -> set[str]:
    return {name for name, value in vars(protocol).items()
            if callable(value) and (not name.startswith("_") or name in
                                    ("__await__", "__enter__", "__exit__", "_shutdown"))}


@pytest.mark.parametrize(("protocol", "implementations"), [
    (looptypes.Loop, (asyncio.new_event_loop, uvloop.new_event_loop, lambda: TrioLoop)),
    (looptypes.Future, (lambda: asyncio.Future, lambda: TrioFuture)),
    (looptypes.Event, (lambda: asyncio.Event, lambda: TrioEvent)),
    (looptypes.Timer, (lambda: asyncio.TimerHandle, lambda: TrioTimer)),
], ids=["Loop", "Future", "Event", "Timer"])
def test_every_declared_method_exists_on_each_implementation(protocol, implementations) -> None:
    names = _methods(protocol)
    assert names, f"{protocol.__name__} declares no methods"
    for make in implementations:
        obj = make()
        try:
            missing = sorted(n for n in names if not callable(getattr(obj, n, None)))
            assert not missing, f"{obj!r} lacks {missing} of {protocol.__name__}"
        finally:
            if isinstance(obj, asyncio.AbstractEventLoop):
                obj.close()
