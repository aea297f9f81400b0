"""A model round over a large fleet (a request named a model no list holds) hands the
event loop back as it goes: at most ``STARTS_PER_TURN`` of its asks start in one turn, and
each answer's list is taken in a turn of its own. All started at once, and every answer
that arrived together taken in one turn, held the loop ~0.2 s at 600 replicas of 300
adapters, for each such request."""

from __future__ import annotations

import asyncio
from collections import Counter

import aiohttp
from aiohttp import web

from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig
from gateway.fleet import Fleet
from gateway.monitor import STARTS_PER_TURN, Monitor
from tests.support.loop_turns import counted_turns
from tests.support.servers import aiohttp_site


async def test_a_model_round_starts_a_bounded_number_a_turn_and_takes_one_list_a_turn(
        ) -> None:
    size, adapters = 200, 20
    listing = {"data": [{"id": "base"}, *({"id": f"lora-{i}", "parent": "base"}
                                          for i in range(adapters))]}

    async def models(request: web.Request) -> web.Response:
        return web.json_response(listing)

    app = web.Application()
    app.router.add_get("/r{n}/v1/models", models)
    runner, port = await aiohttp_site(app)
    fleet = Fleet([ReplicaConfig(id=f"r{i}", url=f"http://127.0.0.1:{port}/r{i}")
                   for i in range(size)])
    started: list[int] = []  # the round's asks started, by the loop's turns
    seen: set[asyncio.Task[object]] = set()
    done = asyncio.Event()

    async def count_starts() -> None:
        while not done.is_set():
            new = {t for t in asyncio.all_tasks() if getattr(
                t.get_coro(), "__qualname__", "") == "Monitor.refresh_models"} - seen
            seen.update(new)
            started.append(len(new))
            await asyncio.sleep(0)

    try:
        async with aiohttp.ClientSession() as session, counted_turns() as turns:
            monitor = Monitor(fleet, session, HealthConfig(timeout_s=30.0),
                              ScrapeConfig(enabled=False))
            taken: list[int] = []  # the loop's turn as each replica's list was taken
            fleet.on_change(lambda: taken.append(turns.count))
            counting = asyncio.create_task(count_starts())
            async with asyncio.timeout(10.0):
                await monitor.refresh_all_models()
                done.set()
                await counting
            fleet.on_change(None)
    finally:
        await runner.cleanup()
    assert len(seen) == size  # each replica asked once
    assert max(started) <= STARTS_PER_TURN, max(started)
    assert len(taken) == size
    assert len(set(taken)) == size, Counter(taken).most_common(3)  # one list a turn
    assert fleet.models() == {"base", *(f"lora-{i}" for i in range(adapters))}
    assert all(state.model_info["lora-3"].parent == "base" for state in fleet)
