"""The ranks a data-parallel replica's /metrics page names, against its configured size:
what the gateway tells the operator."""

from __future__ import annotations

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig
from gateway.fleet import Fleet
from gateway.monitor import Monitor
from tests.support.gateway_harness import Serve


def _page(engines: int) -> str:
    """vLLM's /metrics for a server of ``engines`` data-parallel engines."""
    return "# TYPE vllm:num_requests_running gauge\n" + "".join(
        f'vllm:num_requests_running{{engine="{k}",model_name="m"}} 1.0\n'
        for k in range(engines))


def _server(engines: int) -> Starlette:
    async def metrics(request: Request) -> Response:
        return Response(_page(engines).encode(), media_type="text/plain")

    return Starlette(routes=[Route("/metrics", metrics)])


def _monitor(fleet: Fleet, session: aiohttp.ClientSession) -> Monitor:
    return Monitor(fleet, session, HealthConfig(timeout_s=5.0), ScrapeConfig(timeout_s=5.0))


def _told(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "data_parallel_size is" in r.getMessage()]


async def test_a_replica_added_again_with_another_wrong_size_is_told_again(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    front = serve(_server(2))
    fleet = Fleet(ReplicaConfig("dp", front.url, data_parallel_size=4).ranks())
    async with aiohttp.ClientSession() as session:
        monitor = _monitor(fleet, session)
        await monitor.scrape_round()
        assert len(_told(caplog)) == 1
        await monitor.scrape_round()  # told once while it stays as it is
        assert len(_told(caplog)) == 1
        # the operator sets its size again, still not its server's
        for state in list(fleet):
            fleet.remove(state.id)
        for config in ReplicaConfig("dp", front.url, data_parallel_size=3).ranks():
            fleet.add(config)
        await monitor.scrape_round()
    told = _told(caplog)
    assert len(told) == 2
    assert "data_parallel_size is 3, but its /metrics name ranks 0, 1" in told[1]


async def test_a_page_naming_thousands_of_ranks_is_told_in_a_line_of_its_own_size(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    front = serve(_server(5000))
    fleet = Fleet(ReplicaConfig("dp", front.url, data_parallel_size=2).ranks())
    async with aiohttp.ClientSession() as session:
        monitor = _monitor(fleet, session)
        await monitor.scrape_round()
    (told,) = _told(caplog)
    assert "name ranks 0, 1, 2," in told and "and 4992 more" in told  # 5,000 ranks named
    assert len(told) < 400
