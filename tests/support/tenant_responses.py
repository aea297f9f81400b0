"""Two tenants' stored responses (``/v1/responses``) through a gateway with API keys, in
front of a tiny sim engine served on a loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
KEY_A, KEY_B = "tenantA-key-0123456789", "tenantB-key-0123456789"
# the gateway's auth config for them: tenant "acme" (A) and tenant "evil" (B)
API_KEYS = {"api_keys": [{"key": KEY_A, "tenant": "acme"}, {"key": KEY_B, "tenant": "evil"}]}


def tiny_engine() -> Iterator[LiveEngine]:
    """The engine while the generator runs (a fixture's body: ``yield from``)."""
    run = serve_engine(LiveEngine, MODEL)
    try:
        yield next(run)
    finally:
        run.close()


def post_response(client: httpx.Client, key: str, **body: Any) -> httpx.Response:
    """A two-token ``/v1/responses`` request as the tenant of ``key``."""
    return client.post("/v1/responses", headers={"authorization": f"Bearer {key}"},
                       json={"model": MODEL, "max_output_tokens": 2, **body})


def stored_secret(client: httpx.Client) -> httpx.Response:
    """Tenant A's stored response, a secret in its input (answered 200)."""
    first = post_response(client, KEY_A, input="ACME SECRET: the launch code is 4242")
    assert first.status_code == 200, first.text
    return first


def refused_to_the_other_tenant(client: httpx.Client, secret: str) -> httpx.Response:
    """Tenant B's continuation of tenant A's stored response ``secret`` is refused, streamed
    or not (404 naming ``previous_response_id``), and tenant A's goes on: its answer."""
    for stream in (False, True):
        answer = post_response(client, KEY_B, input="what did I say?",
                               previous_response_id=secret, stream=stream)
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["param"] == "previous_response_id"
    went_on = post_response(client, KEY_A, input="what did I say?",
                            previous_response_id=secret)
    assert went_on.status_code == 200, went_on.text
    return went_on
