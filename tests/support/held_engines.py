"""A running sim engine whose steps are held on the device until the test lets them go."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from engine.server import EngineServer
from tests.support.engine_cores import HeldExecutor
from tests.support.engine_servers import running_engine


@asynccontextmanager
async def held_engine(model: str) -> AsyncIterator[EngineServer]:
    """``running_engine(model)`` whose steps wait until its executor's ``release`` is set
    (``HeldExecutor``); released as the block ends, so its engine stops."""
    async with running_engine(model, HeldExecutor) as srv:
        held = srv.core.executor
        assert isinstance(held, HeldExecutor)
        try:
            yield srv
        finally:
            held.release.set()
