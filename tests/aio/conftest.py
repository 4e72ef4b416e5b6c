"""zcnet.aio's tests: the event loops they run on."""

import pytest


@pytest.hookimpl(optionalhook=True)
def pytest_asyncio_loop_factories(config, item):
    """The event loops pytest-asyncio tests may ask for with mark.asyncio(loop_factories=...);
    zcnet.aio supports both. Imported here: a run without asyncio tests (the one inside a VM)
    does without both."""
    import asyncio

    import uvloop

    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
