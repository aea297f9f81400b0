"""A health check or scrape still running when its replica was removed, or removed and
added again under its id at a new address (a StatefulSet pod back with a new IP), is about
the old address: its answer must not count for the replica now under that id."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig
from gateway.fleet import Fleet
from gateway.monitor import Monitor
from tests.support.servers import aiohttp_site


async def test_a_probe_of_the_old_address_does_not_count_for_the_replica_added_again(
        ) -> None:
    release = asyncio.Event()

    async def stalled(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(status=500, text="vllm_num_requests_running 0\n")

    app = web.Application()
    app.router.add_get("/health", stalled)
    app.router.add_get("/metrics", stalled)
    runner, port = await aiohttp_site(app)
    fleet = Fleet([ReplicaConfig(id="pod-0", url=f"http://127.0.0.1:{port}")])
    try:
        async with aiohttp.ClientSession() as session:
            monitor = Monitor(fleet, session, HealthConfig(timeout_s=5.0, failures_to_eject=1),
                              ScrapeConfig(timeout_s=5.0, stale_after_failures=1))
            old = fleet.get("pod-0")
            assert old is not None
            probes = asyncio.gather(monitor.check_one(old), monitor.scrape_one(old))
            await asyncio.sleep(0.2)  # both probes wait on the old address
            fleet.remove("pod-0")
            new = fleet.add(ReplicaConfig(id="pod-0", url="http://127.0.0.1:1"),
                            checked_first=True)
            release.set()  # the old address fails both
            await probes
            assert (new.checks, new.consecutive_failures, new.awaiting_check) == (0, 0, True)
            assert new.last_check == (True, None) and new.scrape_failures == 0
            # the replica's own check counts
            await monitor.check_one(new)
            assert new.checks == 1 and new.last_check[0] is False
    finally:
        await runner.cleanup()
