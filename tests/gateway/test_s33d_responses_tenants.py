"""A stored response is its tenant's: through a gateway with client API keys and
``tenancy.isolate``, another tenant's ``previous_response_id`` is a 404 naming it, the
same answer as an id no replica stores, whether the gateway saw the response answered
(it refuses it) or not (each replica, asked in turn, holds it to its tenant's salt);
its own tenant goes on continuing it. Without ``isolate`` the gateway that saw it
answered refuses it all the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.gateway_harness import Gateway, Serve, start_gateway

MODEL = "tiny-sim"
KEY_A, KEY_B = "tenantA-key-0123456789", "tenantB-key-0123456789"
KEYS = {"api_keys": [{"key": KEY_A, "tenant": "acme"}, {"key": KEY_B, "tenant": "evil"}]}
TENANTS = {"auth": KEYS,
           "tenancy": {"isolate": True, "secret": "0123456789abcdef0123456789abcdef0123"}}


@pytest.fixture(scope="module")
def engines() -> Iterator[list[LiveEngine]]:
    runs = [serve_engine(LiveEngine, MODEL) for _ in range(2)]
    try:
        yield [next(run) for run in runs]
    finally:
        for run in runs:
            run.close()


def _post(gw: Gateway, key: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/responses", timeout=30,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": MODEL, "max_output_tokens": 2, **body})


def test_another_tenants_response_is_not_found(serve: Serve,
                                                engines: list[LiveEngine]) -> None:
    replicas = [(f"e{i}", live.url) for i, live in enumerate(engines)]
    gw = start_gateway(serve, replicas, **TENANTS)
    first = _post(gw, KEY_A, input="ACME SECRET: the launch code is 4242")
    assert first.status_code == 200, first.text
    secret = first.json()["id"]
    answers = [_post(gw, KEY_B, input="what did I say?", previous_response_id=secret),
               _post(gw, KEY_B, input="what did I say?", previous_response_id=secret,
                     stream=True)]
    assert [a.status_code for a in answers] == [404, 404], answers[0].text
    # the answer to an id no replica stores, naming no replica (nothing to tell apart)
    unknown = _post(gw, KEY_B, input="x", previous_response_id="resp_nowhere")
    assert unknown.status_code == 404
    expected = unknown.json()["error"]
    assert expected["param"] == "previous_response_id" and "e0" not in expected["message"]

    def refused(answer: httpx.Response) -> None:
        assert answer.status_code == 404, answer.text
        assert answer.json() == {"error": {**expected, "message": expected["message"].replace(
            "resp_nowhere", secret)}}

    for answer in answers:
        refused(answer)
    # a gateway that did not see it answered: each replica holds it to the salt it was
    # made under, so another tenant's request is refused there
    other = start_gateway(serve, replicas, **TENANTS)
    refused(_post(other, KEY_B, input="what did I say?", previous_response_id=secret))
    for gateway in (gw, other):  # its own tenant goes on, where it is stored
        went_on = _post(gateway, KEY_A, input="what did I say?", previous_response_id=secret)
        assert went_on.status_code == 200, went_on.text
        assert went_on.headers["x-kvgate-replica"] == first.headers["x-kvgate-replica"]
        assert went_on.json()["usage"]["input_tokens"] > first.json()["usage"]["input_tokens"]


def test_without_isolate_the_gateway_that_saw_a_response_refuses_another_tenant(
        serve: Serve, engines: list[LiveEngine]) -> None:
    # no salt reaches the replicas: the gateway process that saw the response answered
    # is what keeps it its tenant's
    gw = start_gateway(serve, [(f"e{i}", live.url) for i, live in enumerate(engines)],
                       auth=KEYS)
    first = _post(gw, KEY_A, input="ACME SECRET: the launch code is 4242")
    assert first.status_code == 200, first.text
    secret = first.json()["id"]
    refused = _post(gw, KEY_B, input="what did I say?", previous_response_id=secret)
    unknown = _post(gw, KEY_B, input="x", previous_response_id="resp_nowhere")
    assert refused.status_code == unknown.status_code == 404, refused.text
    expected = unknown.json()["error"]
    assert refused.json() == {"error": {**expected, "message": expected["message"].replace(
        "resp_nowhere", secret)}}
    went_on = _post(gw, KEY_A, input="what did I say?", previous_response_id=secret)
    assert went_on.status_code == 200, went_on.text
    assert went_on.headers["x-kvgate-replica"] == first.headers["x-kvgate-replica"]
