"""A request that ends on a fault of the gateway's own (answered 500 internal_error) is
still one request: its ``kvgate_requests_total`` sample (``GatewayState.ended``, which
writes its access-log line too)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx

from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from policies.base import Decision, Policy, ReplicaView, RouteRequest
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]


class Broken(Policy):
    name = "broken"
    reasons = ("never",)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        raise RuntimeError("a bug in the policy")


def test_a_request_the_policy_fails_on_is_counted(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a")))
    config = parse_config({"replicas": [{"id": "a", "url": replica.url}]})
    server = serve(create_app(config, build_state(config, policy=Broken())))
    answer = httpx.post(f"{server.url}/v1/completions",
                        json={"model": "sim-model", "prompt": "hello", "max_tokens": 2})
    assert answer.status_code == 500 and answer.json()["error"]["code"] == "internal_error"
    page = httpx.get(f"{server.url}/metrics").text
    assert 'kvgate_requests_total{replica="none",route="none",status="500"} 1.0' in page
