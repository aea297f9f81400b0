"""A replica added at run time (admin or discovery) has one health check in flight at a
time: the health loop starts none of its own while the check its joining started runs.
Two overlapping checks could answer out of order: a late failure of the first, counted
after the second had passed, ejected a replica that had just come in."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from gateway.config import ReplicaConfig, parse_config
from gateway.fleet_events import FleetEvent, HealthChanged
from gateway.membership import join
from gateway.monitor import Monitor
from gateway.state import build_state
from tests.support.servers import aiohttp_site
from tests.support.waiting import wait_until_async


async def test_a_late_failure_of_the_joining_check_ejects_no_replica_a_later_one_let_in(
        ) -> None:
    release = asyncio.Event()
    new_checks: list[int] = []  # of the new replica's /health, each one's number
    ticks: list[int] = []  # of the other replica's: health rounds that ran

    async def new_health(request: web.Request) -> web.Response:
        new_checks.append(len(new_checks))
        if len(new_checks) == 1:  # the first: answered late, and failing
            await release.wait()
            return web.Response(status=503)
        return web.Response(text="ok")

    async def other_health(request: web.Request) -> web.Response:
        ticks.append(len(ticks))
        return web.Response(text="ok")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    runners = []
    ports = []
    for health in (new_health, other_health):
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        runner, port = await aiohttp_site(app)
        runners.append(runner)
        ports.append(port)
    gw = build_state(parse_config({
        "replicas": [{"id": "other", "url": f"http://127.0.0.1:{ports[1]}"}],
        "health": {"interval_s": 0.02, "timeout_s": 30, "failures_to_eject": 1},
        "scrape": {"enabled": False}}))
    told: list[bool] = []

    def heard(event: FleetEvent) -> None:
        if isinstance(event, HealthChanged) and event.replica == "new":
            told.append(event.healthy)

    gw.fleet.listen(heard)
    try:
        async with aiohttp.ClientSession() as session:
            gw.monitor = Monitor(gw.fleet, session, gw.config.health, gw.config.scrape)
            await gw.monitor.start()
            try:
                joining = asyncio.create_task(join(gw, ReplicaConfig(
                    id="new", url=f"http://127.0.0.1:{ports[0]}"), "admin"))
                await wait_until_async(lambda: new_checks, 10, "the joining check")
                seen = len(ticks)
                # health rounds run meanwhile (the other replica checked in each)
                await wait_until_async(lambda: len(ticks) >= seen + 5, 10, "5 health rounds")
                during = len(new_checks)
                release.set()
                await joining
                state = gw.fleet.get("new")
                assert state is not None
                await wait_until_async(lambda: state.healthy, 10, "a passing check")
                assert told == [True]  # in once, at its first check that passed
                assert during == 1  # no other check while the joining one ran
            finally:
                release.set()
                await gw.monitor.stop()
    finally:
        for runner in runners:
            await runner.cleanup()
