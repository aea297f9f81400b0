"""``GET /v1/models/{model}`` (the openai client's ``models.retrieve``): the entry
``/v1/models`` lists for it (an adapter's id holds a slash, as a path's tail), a 404
``model_not_found`` naming a model the list lacks, and a client's key asked as on
``/v1/models``."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import start_gateway
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
KEY = "client-key-0123456789abcdef"


def test_a_model_is_retrieved_as_listed_and_an_unknown_one_is_not_found(
        serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a", model="org/base", adapters=1)))
    gw = start_gateway(serve, [("a", replica.url)],
                       auth={"api_keys": [{"key": KEY, "tenant": "t"}]})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=KEY, max_retries=0)
    wait_until(lambda: len(client.models.list().data) == 2, 10, "the models listed")
    listed = {m.id: m.model_dump() for m in client.models.list().data}
    assert set(listed) == {"org/base", "org/base-lora-0"}
    for name, card in listed.items():
        assert client.models.retrieve(name).model_dump() == card
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("org/nope")
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "model_not_found" and "org/nope" in error["message"], error
    unnamed = httpx.get(f"{gw.url}/v1/models/", headers={"authorization": f"Bearer {KEY}"})
    assert unnamed.status_code == 404 and "names no model" in unnamed.text, unnamed.text
    keyless = httpx.get(f"{gw.url}/v1/models/org/base")
    assert keyless.status_code == 401, keyless.text
    page = httpx.get(f"{gw.url}/metrics").text
    assert 'kvgate_requests_total{replica="none",route="none",status="404"}' in page
