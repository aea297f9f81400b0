"""A model loaded on the replicas at run time (a LoRA adapter through vLLM's
``/v1/load_lora_adapter``, then in its ``/v1/models``) under ``serve --workers N``: every
worker routes it at once, as a single gateway does, not only worker 0 until its next
models refresh; and a follower that learned it keeps it until the leader's word is newer."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.metrics import client_on_worker, samples
from tests.support.processes import Processes
from tests.support.servers import ThreadServer, free_port
from tests.support.waiting import wait_until

ADAPTER = "sim-model-lora-0"  # what the fake replica lists once ``adapters`` is 1


class CountedModels:
    """The fake replica, counting the /v1/models calls it answers."""

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.listings = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and Request(scope).url.path == "/v1/models":
            self.listings += 1
        await self.app(scope, receive, send)


def _complete(client: httpx.Client, model: str) -> httpx.Response:
    return client.post("/v1/completions", json={"model": model, "prompt": "hi",
                                                "max_tokens": 2})


@pytest.fixture
def box(spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path
        ) -> Iterator[tuple[Behaviour, CountedModels, httpx.Client, httpx.Client]]:
    """Two workers before one fake replica, whose models worker 0 asks again only on a
    miss of its own (``models_refresh_s`` is an hour); a client kept on each worker."""
    behaviour = Behaviour("r0", chunks=1)
    replica = CountedModels(fake_replica(behaviour))
    served = serve(replica)
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "policy": {"name": "least_load"},
        "replicas": [{"id": "r0", "url": served.url}],
        "health": {"interval_s": 0.1, "models_refresh_s": 3600},
        "scrape": {"interval_s": 0.1}, "shutdown": {"grace_s": 0}}))
    url = f"http://127.0.0.1:{port}"
    spawn("serve", "--config", str(config), "--workers", "2", ready_url=f"{url}/ready")
    with contextlib.ExitStack() as clients:
        leader = clients.enter_context(contextlib.closing(client_on_worker(url, "0")))
        follower = clients.enter_context(contextlib.closing(client_on_worker(url, "1")))
        yield behaviour, replica, leader, follower


def test_a_model_loaded_at_run_time_is_routed_by_a_follower_at_once(
        box: tuple[Behaviour, CountedModels, httpx.Client, httpx.Client]) -> None:
    behaviour, replica, leader, follower = box
    assert _complete(follower, "sim-model").status_code == 200
    behaviour.adapters = 1  # loaded on the replica: worker 0 has not listed it again
    answer = _complete(follower, ADAPTER)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-kvgate-worker"] == "1"
    # worker 0's snapshots go on (a scrape's new figures reach the follower): they carry
    # its older list, which must not take the adapter back from the follower
    behaviour.queued_tokens = 54_321

    def scraped_here() -> bool:
        seen = samples(follower.get("/metrics").text)
        return seen.get(("kvgate_replica_queued_tokens", (("replica", "r0"),)), 0) >= 54_321

    wait_until(scraped_here, 10, "the follower to apply a snapshot of a newer scrape")
    assert _complete(follower, ADAPTER).status_code == 200
    # a flood for a model nobody serves: the follower lists the replica's models at most
    # once a second (worker 0 saw none of these requests, and lists them hourly)
    before = replica.listings
    began = time.monotonic()
    for _ in range(3):  # each waits for the next round, a second apart
        answer = _complete(follower, "no-such-model")
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "model_not_found"
    assert replica.listings - before <= 1 + int(time.monotonic() - began)
    assert _complete(leader, ADAPTER).status_code == 200
