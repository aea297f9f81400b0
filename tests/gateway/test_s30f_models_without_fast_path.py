"""``/v1/models`` answers and counts its request when the gateway's Starlette app is
served alone, without the layer in front of it that stamps a request's arrival (a host
that mounts the app, or a test client of it): the duration then starts where it is
answered, as ``CountingBoundary``'s refusals do."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from starlette.applications import Starlette

from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]


def test_models_is_answered_and_counted_by_the_app_alone(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a")))
    config = parse_config({"replicas": [{"id": "a", "url": replica.url}]})
    outer = create_app(config, build_state(config))
    app = getattr(outer, "app", None)  # the Starlette app inside the fast path
    assert isinstance(app, Starlette)
    server = serve(app)
    answer = httpx.get(f"{server.url}/v1/models")
    assert answer.status_code == 200 and answer.json()["object"] == "list"
    page = httpx.get(f"{server.url}/metrics").text
    assert 'kvgate_requests_total{replica="none",route="none",status="200"} 1.0' in page
