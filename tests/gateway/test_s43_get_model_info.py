"""SGLang's ``GET /get_model_info`` (SGLang's frontend reads ``model_path`` from it when it
connects): the fleet's model, where its replicas loaded it from, as ``/v1/models`` shows it
to the client's tenant; ``?model=`` names one of several; a client's key asked as on
``/v1/models``."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import start_gateway
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
KEY = "client-key-0123456789abcdef"
AUTH = {"authorization": f"Bearer {KEY}"}


def test_the_fleets_model_is_told_where_it_was_loaded_from(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a", model="llama", root="/models/llama-3-8b",
                                           adapters=1)))
    gw = start_gateway(serve, [("a", replica.url)],
                       auth={"api_keys": [{"key": KEY, "tenant": "t"}]})
    wait_until(lambda: httpx.get(f"{gw.url}/get_model_info", headers=AUTH).status_code
               == 200, 10, "the replica's models listed")
    info = httpx.get(f"{gw.url}/get_model_info", headers=AUTH).json()
    # the base model, not its adapter, though both are listed
    assert info == {"model_path": "/models/llama-3-8b", "tokenizer_path": "/models/llama-3-8b",
                    "served_model_name": "llama"}, info
    assert httpx.get(f"{gw.url}/get_model_info").status_code == 401
    unknown = httpx.get(f"{gw.url}/get_model_info", params={"model": "nope"}, headers=AUTH)
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]["message"]
    # an adapter is told by its base model's path, as SGLang tells one
    adapter = httpx.get(f"{gw.url}/get_model_info", params={"model": "llama-lora-0"},
                        headers=AUTH).json()
    assert adapter == {"model_path": "/models/llama-3-8b",
                       "tokenizer_path": "/models/llama-3-8b",
                       "served_model_name": "llama-lora-0"}, adapter
    empty = httpx.get(f"{gw.url}/get_model_info?model=", headers=AUTH)
    assert empty.status_code == 400 and "?model= is empty" in empty.json()["error"]["message"]


def test_a_fleet_of_several_models_is_asked_which(serve: Serve) -> None:
    a = serve(fake_replica(Behaviour("a", model="org/one")))
    b = serve(fake_replica(Behaviour("b", model="org/two")))
    gw = start_gateway(serve, [("a", a.url), ("b", b.url)])
    wait_until(lambda: httpx.get(f"{gw.url}/get_model_info").status_code == 400, 10,
               "both replicas' models listed")
    several = httpx.get(f"{gw.url}/get_model_info").json()["error"]
    assert several["param"] == "model" and "org/one, org/two" in several["message"], several
    named = httpx.get(f"{gw.url}/get_model_info", params={"model": "org/two"}).json()
    assert named["model_path"] == "org/two" and named["served_model_name"] == "org/two"


def test_a_fleet_whose_models_are_not_known_yet_is_a_503(serve: Serve) -> None:
    # no replica answers (a closed port): nothing has listed a model, and the 503 says so
    gw = start_gateway(serve, [("a", "http://127.0.0.1:9")])
    answer = httpx.get(f"{gw.url}/get_model_info")
    assert answer.status_code == 503, answer.text
    assert "has listed a model yet" in answer.json()["error"]["message"]
