"""A replica's url is its server's address (and base path, if it serves under one): the
gateway adds /v1/... and /health itself. A url written as an OpenAI client's base_url
(ending in /v1) is refused where a replica is configured, added or found, naming the url
and the address to write instead; a failed health check names the whole URL it fetched."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from gateway.config import HealthConfig, ReplicaConfig, ScrapeConfig, load_config
from gateway.discovery.replica_checks import refusal
from gateway.fleet import Fleet
from gateway.monitor import Monitor
from policies.config import ConfigError
from tests.support.admin_posts import admin_app, post_replica
from tests.support.servers import aiohttp_site


@pytest.mark.parametrize("url, fixed", [
    ("http://127.0.0.1:8101/v1", "http://127.0.0.1:8101"),
    ("http://127.0.0.1:8101/v1/", "http://127.0.0.1:8101"),
    ("https://proxy.internal/vllm/v1", "https://proxy.internal/vllm")])
def test_a_url_ending_in_v1_is_refused_at_load(tmp_path: Path, url: str, fixed: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"replicas": [
        {"id": "r0", "url": "http://127.0.0.1:8100"}, {"id": "r1", "url": url}]}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    said = str(err.value)
    assert said.startswith(f"{path}.replicas[1]: url {url!r} of replica 'r1' ends in /v1"), said
    assert "/v1/v1/chat/completions" in said
    assert said.endswith(f"write the replica's address without it, {fixed!r}"), said


def test_a_base_path_without_v1_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"replicas": [
        {"id": "r0", "url": "http://127.0.0.1:8101/vllm"},
        {"id": "r1", "url": "http://127.0.0.1:8102/v10/"}]}))
    assert [r.base_url for r in load_config(path).replicas] == [
        "http://127.0.0.1:8101/vllm", "http://127.0.0.1:8102/v10"]


async def test_the_admin_api_and_discovery_refuse_it_too() -> None:
    got = await post_replica(admin_app(), orjson.dumps(
        {"id": "b", "url": "http://127.0.0.1:8101/v1"}))
    assert got.status_code == 400, got.text
    assert "ends in /v1" in got.json()["error"]["message"]
    assert "'http://127.0.0.1:8101'" in got.json()["error"]["message"]
    why = refusal(ReplicaConfig(id="10.0.0.7:8000", url="http://10.0.0.7:8000/v1"))
    assert why is not None and "write the replica's address without it, " \
        "'http://10.0.0.7:8000'" in why


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def test_a_failed_health_check_names_the_url_it_fetched() -> None:
    app = web.Application()
    app.router.add_get("/health", _ok)  # not at /vllm/health
    runner, port = await aiohttp_site(app)
    url = f"http://127.0.0.1:{port}/vllm"
    fleet = Fleet([ReplicaConfig(id="r0", url=url)])
    try:
        async with aiohttp.ClientSession() as session:
            monitor = Monitor(fleet, session, HealthConfig(failures_to_eject=1), ScrapeConfig())
            state = fleet.get("r0")
            assert state is not None
            await monitor.check_one(state)
            assert not state.healthy
            assert state.last_error == f"GET {url}/health answered 404; " \
                f"GET {url}/v1/models answered 404"
    finally:
        await runner.cleanup()
