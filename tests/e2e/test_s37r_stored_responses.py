"""The official openai client's stored-response calls through ``kvgate serve`` (API keys:
two tenants) in front of two sim engines: ``responses.retrieve``, ``input_items.list``,
``delete`` and ``cancel`` reach the replica that stored the response, or, for one this
gateway never saw answered, the replicas in turn; another tenant's id is a 404 as an
unknown one is, and a deleted response can be neither retrieved nor continued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.processes import Processes
from tests.support.servers import free_port
from tests.support.tenant_responses import API_KEYS, KEY_A, KEY_B, MODEL

pytestmark = pytest.mark.slow


class Fleet:
    def __init__(self, url: str, engines: list[LiveEngine]) -> None:
        self.url = url
        self.engines = engines

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    runs = [serve_engine(LiveEngine, MODEL) for _ in range(2)]
    processes = Processes()
    try:
        engines = [next(run) for run in runs]
        port = free_port()
        config: Path = tmp_path_factory.mktemp("s37r") / "gateway.yaml"
        config.write_text(yaml.safe_dump({
            "port": port, "policy": {"name": "round_robin"},
            "replicas": [{"id": f"e{i}", "url": e.url} for i, e in enumerate(engines)],
            "auth": API_KEYS, "shutdown": {"grace_s": 0, "timeout_s": 5}}))
        url = f"http://127.0.0.1:{port}"
        processes("serve", "--config", str(config), ready_url=f"{url}/ready")
        yield Fleet(url, engines)
    finally:
        processes.stop_all()
        for run in runs:
            run.close()


def test_each_call_reaches_the_replica_that_stored_it(fleet: Fleet) -> None:
    with fleet.client(KEY_A) as acme, fleet.client(KEY_B) as evil:
        made = [acme.responses.with_raw_response.create(
            model=MODEL, input=f"secret {i}", max_output_tokens=2) for i in range(2)]
        homes = {raw.parse().id: raw.headers["x-kvgate-replica"] for raw in made}
        assert set(homes.values()) == {"e0", "e1"}  # round robin: one on each
        for rid, home in homes.items():
            got = acme.responses.with_raw_response.retrieve(rid)
            assert got.headers["x-kvgate-replica"] == home
            assert got.parse().id == rid and got.parse().output_text
            items = acme.responses.input_items.list(rid)
            assert items.data[0].content[0].text.startswith("secret")  # type: ignore
            with pytest.raises(openai.BadRequestError) as refused:
                acme.responses.cancel(rid)
            assert "synchronous" in refused.value.message
            # another tenant: a 404 as for an id never stored, on every call
            for call in (evil.responses.retrieve, evil.responses.delete,
                         evil.responses.input_items.list, evil.responses.cancel):
                with pytest.raises(openai.NotFoundError) as caught:
                    call(rid)
                assert caught.value.body == {  # type: ignore[comparison-overlap]
                    "message": f"Response with id {rid!r} not found.",
                    "type": "invalid_request_error", "param": "response_id",
                    "code": "response_not_found"}
            assert acme.responses.retrieve(rid).id == rid  # still there


def test_delete_then_retrieve_and_continue_are_404(fleet: Fleet) -> None:
    with fleet.client(KEY_A) as acme:
        rid = acme.responses.create(model=MODEL, input="forget me", max_output_tokens=2).id
        assert acme.responses.delete(rid) is None
        with pytest.raises(openai.NotFoundError):
            acme.responses.retrieve(rid)
        with pytest.raises(openai.NotFoundError) as cont:
            acme.responses.create(model=MODEL, input="go on", previous_response_id=rid)
        assert cont.value.body["param"] == "previous_response_id"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            acme.responses.delete(rid)


def test_a_response_this_gateway_never_saw_is_asked_of_the_replicas(fleet: Fleet) -> None:
    # stored on the second engine by another way in (another gateway copy, say)
    made = fleet.engines[1].http.post("/v1/responses", headers={"x-kvgate-tenant": "acme"},
                                      json={"model": MODEL, "input": "elsewhere",
                                            "max_output_tokens": 2})
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    with fleet.client(KEY_A) as acme, fleet.client(KEY_B) as evil:
        got = acme.responses.with_raw_response.retrieve(rid)
        assert got.headers["x-kvgate-replica"] == "e1" and got.parse().id == rid
        with pytest.raises(openai.NotFoundError):  # the replica's own tenant check
            evil.responses.retrieve(rid)
        with pytest.raises(openai.NotFoundError):
            acme.responses.retrieve("resp_never_stored")
    unkeyed = httpx.get(f"{fleet.url}/v1/responses/{rid}")
    assert unkeyed.status_code == 401
