"""Each replica's health checks and scrapes run on their own schedule: one replica whose
/health or /metrics hangs (up to its timeout) delays only itself; the others are checked and
scraped every interval meanwhile. A replica removed has its check or scrape in flight
dropped, one added is taken up, and nothing runs on after the monitor stops."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig
from gateway.fleet import Fleet
from gateway.monitor import Monitor
from tests.support.servers import aiohttp_site
from tests.support.waiting import wait_until_async

_PAGE = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"


class Replica:
    """A replica on 127.0.0.1 that counts the calls it gets, per path; with ``hang``, its
    answers on that path from the second on wait until ``release`` (or the caller leaves)."""

    def __init__(self, hang: str | None = None) -> None:
        self.hang = hang
        self.release = asyncio.Event()
        self.calls: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.url = ""

    async def _answer(self, request: web.Request) -> web.Response:
        path = request.path
        self.calls[path] += 1
        self.in_flight[path] += 1
        try:
            if path == self.hang and self.calls[path] >= 2:
                await self.release.wait()
            if path == "/v1/models":
                return web.json_response({"data": [{"id": "m"}]})
            return web.Response(text=_PAGE if path == "/metrics" else "")
        finally:
            self.in_flight[path] -= 1

    async def start(self, runners: list[web.AppRunner]) -> Replica:
        app = web.Application()
        for path in ("/health", "/metrics", "/v1/models"):
            app.router.add_get(path, self._answer)
        # a caller that leaves ends its handler: an abandoned call shows on the server
        runner, port = await aiohttp_site(app, handler_cancellation=True)
        runners.append(runner)
        self.url = f"http://127.0.0.1:{port}"
        return self


@pytest.fixture
async def runners() -> AsyncIterator[list[web.AppRunner]]:
    started: list[web.AppRunner] = []
    yield started
    for runner in started:
        await runner.cleanup()


def _monitor_tasks() -> list[str]:
    return [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("kvgate-")]


@pytest.mark.parametrize("path", ["/health", "/metrics"])
async def test_a_hanging_replica_delays_only_itself(path: str,
                                                    runners: list[web.AppRunner]) -> None:
    fast = await Replica().start(runners)
    slow = await Replica(hang=path).start(runners)
    fleet = Fleet([ReplicaConfig(id="fast", url=fast.url),
                   ReplicaConfig(id="slow", url=slow.url)])
    often, seldom = 0.02, 3600.0  # the other loop runs its first round only
    health = HealthConfig(interval_s=often if path == "/health" else seldom, timeout_s=60.0)
    scrape = ScrapeConfig(interval_s=often if path == "/metrics" else seldom, timeout_s=60.0)
    async with aiohttp.ClientSession() as session:
        monitor = Monitor(fleet, session, health, scrape)
        try:
            await monitor.start()
            await wait_until_async(lambda: slow.in_flight[path] == 1, 10.0,
                                   f"the slow replica's second {path} call")
            seen = fast.calls[path]
            await wait_until_async(lambda: fast.calls[path] >= seen + 3, 10.0,
                                   f"more {path} calls of the fast replica")
            # ... all while the slow replica's call still waits, and no other was made
            assert (slow.calls[path], slow.in_flight[path]) == (2, 1)
            fast_state = fleet.get("fast")
            assert fast_state is not None and fast_state.healthy
        finally:
            await monitor.stop()
            slow.release.set()
    assert _monitor_tasks() == []
    assert slow.in_flight[path] == 0  # the call waiting at stop was given up


async def test_schedules_follow_membership(runners: list[web.AppRunner]) -> None:
    fast = await Replica().start(runners)
    slow = await Replica(hang="/metrics").start(runners)
    back = await Replica().start(runners)
    fleet = Fleet([ReplicaConfig(id="fast", url=fast.url),
                   ReplicaConfig(id="slow", url=slow.url)])
    async with aiohttp.ClientSession() as session:
        monitor = Monitor(fleet, session, HealthConfig(interval_s=0.02, timeout_s=60.0),
                          ScrapeConfig(interval_s=0.02, timeout_s=60.0))
        try:
            await monitor.start()
            await wait_until_async(lambda: slow.in_flight["/metrics"] == 1, 10.0,
                                   "the slow replica's hanging scrape")
            fleet.remove("slow")  # its scrape in flight is given up, none follows
            await wait_until_async(lambda: slow.in_flight["/metrics"] == 0, 10.0,
                                   "the removed replica's scrape to end")
            # added again at another address: scraped and checked there
            fleet.add(ReplicaConfig(id="slow", url=back.url))
            await wait_until_async(lambda: back.calls["/metrics"] >= 2, 10.0,
                                   "scrapes of the replica added")
            await wait_until_async(lambda: back.calls["/health"] >= 2, 10.0,
                                   "health checks of the replica added")
            assert slow.calls["/metrics"] == 2  # none after the one given up
            seen = fast.calls["/metrics"]
            await wait_until_async(lambda: fast.calls["/metrics"] > seen, 10.0,
                                   "the fast replica scraped still")
        finally:
            await monitor.stop()
            slow.release.set()
    assert _monitor_tasks() == []
