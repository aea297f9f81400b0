"""``kvgate serve --workers 2`` keeps a stored response its tenant's on every worker: the
worker that saw it answered tells the others its replica and tenant, so another tenant's
``previous_response_id`` is refused by whichever worker the continuation reaches. Without
``tenancy.isolate`` no salt reaches the replicas, and a replica (vLLM's, or this one)
would continue any tenant's stored response: the workers are what keep it its tenant's,
with or without ``--no-worker-routes`` (which keeps routes untold, not stored responses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.engine_servers import LiveEngine
from tests.support.metrics import client_on_worker, per_worker
from tests.support.processes import Processes
from tests.support.servers import free_port
from tests.support.tenant_responses import (
    API_KEYS,
    refused_to_the_other_tenant,
    stored_secret,
    tiny_engine,
)

pytestmark = pytest.mark.slow



@pytest.fixture
def engine() -> Iterator[LiveEngine]:
    yield from tiny_engine()


@pytest.mark.parametrize("flags", [[], ["--no-worker-routes"]])
def test_another_workers_tenant_cannot_continue_a_stored_response(
        spawn: Processes, engine: LiveEngine, tmp_path: Path, flags: list[str]) -> None:
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "policy": {"name": "round_robin"},
        "replicas": [{"id": "e0", "url": engine.url}],
        "auth": API_KEYS,
        "shutdown": {"grace_s": 0, "timeout_s": 20}}))
    url = f"http://127.0.0.1:{port}"
    spawn("serve", "--config", str(config), "--workers", "2", *flags,
          ready_url=f"{url}/ready")
    per_worker(url, lambda s: True, "both workers to listen")
    with httpx.Client(base_url=url, timeout=30) as first_client:
        first = stored_secret(first_client)
    secret, made_on = first.json()["id"], first.headers["x-kvgate-worker"]
    other = "1" if made_on == "0" else "0"
    client = client_on_worker(url, other)
    try:
        # and its own tenant goes on continuing it there
        went_on = refused_to_the_other_tenant(client, secret)
        assert went_on.headers["x-kvgate-worker"] == other
    finally:
        client.close()
