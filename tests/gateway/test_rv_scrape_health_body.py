"""A replica's /health is read for its status: a body without end (a health URL that
reaches a stream) is not read into the gateway's memory, and its 200 counts."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig
from gateway.fleet import Fleet
from gateway.monitor import Monitor
from tests.support.servers import aiohttp_site


async def test_a_health_answer_without_end_is_read_no_further_than_a_bound() -> None:
    served = 0
    chunk = b"ok " * (1 << 16)

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal served
        resp = web.StreamResponse(status=200)
        await resp.prepare(request)
        try:
            while True:
                await resp.write(chunk)
                served += len(chunk)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the gateway hung up
        return resp

    app = web.Application()
    app.router.add_get("/health", endless)
    runner, port = await aiohttp_site(app)
    fleet = Fleet([ReplicaConfig(id="r", url=f"http://127.0.0.1:{port}")])
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            monitor = Monitor(fleet, session, HealthConfig(timeout_s=2.0), ScrapeConfig())
            state = fleet.get("r")
            assert state is not None
            await monitor.check_one(state)
            # the answer was 200: the replica is in (it timed out, read to no end)
            assert state.last_check == (True, None)
    finally:
        await runner.cleanup()
    # what the replica got out before the gateway hung up: socket buffers, not the
    # seconds of a timeout at loopback speed
    assert served < 32 << 20, served
