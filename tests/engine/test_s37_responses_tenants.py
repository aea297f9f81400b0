"""The engine's store of Responses conversations: sized by ``kvgate engine`` flags, one
share per tenant (the tenant the gateway names in ``x-kvgate-tenant``), so one tenant's
traffic never forgets another's responses while that one holds less than its part; its
size counts the bytes of a string's characters. ``conversation``, a stored ``prompt`` and
an empty ``previous_response_id`` are refused naming the field; a cut response's message
item is ``incomplete``, and a cancelled response carries no error."""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

import httpx
import pytest

from engine import cli as engine_cli
from engine.cli import Served
from engine.responses_route import ResponsesRoute, ResponseStore
from tests.support.gateway_harness import Serve

TENANT = "x-kvgate-tenant"


def _served(argv: list[str]) -> Served:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    return engine_cli.build_served(parser.parse_args([*argv, "--kv-cache-gib", "0.05"]))


def _route(served: Served) -> ResponsesRoute:
    """The app's ``/v1/responses`` route (what its store holds is looked at)."""
    route = next(r for r in served.app.routes if getattr(r, "path", "") == "/v1/responses")
    owner = route.endpoint.__self__
    assert isinstance(owner, ResponsesRoute)
    return owner


def _post(http: httpx.Client, tenant: str | None, **body: Any) -> httpx.Response:
    return http.post("/v1/responses", json={"max_output_tokens": 1, **body},
                     headers={TENANT: tenant} if tenant else {})


def test_a_tenants_flood_leaves_another_tenants_responses(serve: Serve) -> None:
    served = _served(["--responses-store-limit", "8", "--responses-store-mib", "1"])
    store = _route(served).store
    assert (store.limit, store.max_chars) == (8, 1 << 20)
    with httpx.Client(base_url=serve(served.app).url, timeout=30) as http:
        kept = [_post(http, "acme", input=f"acme {i}").json()["id"] for i in range(2)]
        flood = [_post(http, tenant, input=f"{tenant} {i}").json()["id"]
                 for i in range(12) for tenant in ("evil", None)]
        store.check_integrity()
        assert len(store) == 8 and store.tenants()["acme"] == 2
        for rid in kept:  # continued by their tenant, whatever the others stored since
            r = _post(http, "acme", input="go on", previous_response_id=rid)
            assert r.status_code == 200, r.text
        # the flooders lost their own oldest, and keep their latest
        assert _post(http, "evil", input="x", previous_response_id=flood[0]).status_code == 404
        assert _post(http, None, input="x", previous_response_id=flood[-1]).status_code == 200
        store.check_integrity()


def test_the_tenant_header_is_the_flags(serve: Serve) -> None:
    served = _served(["--responses-store-limit", "3", "--responses-tenant-header", "x-org"])
    store = _route(served).store
    with httpx.Client(base_url=serve(served.app).url, timeout=30) as http:
        http.post("/v1/responses", json={"input": "a", "max_output_tokens": 1},
                  headers={"x-org": "one"})
        for i in range(4):
            http.post("/v1/responses", json={"input": f"b {i}", "max_output_tokens": 1},
                      headers={"x-org": "two"})
    assert store.tenants() == {"one": 1, "two": 2}
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    for argv in (["--responses-store-limit", "0"], ["--responses-store-mib", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)


def _turns(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]


def test_the_largest_tenant_gives_first_in_count_and_in_size() -> None:
    store = ResponseStore(limit=10, max_chars=100_000)
    for i in range(40):  # a flood in count
        store.put(f"b{i}", _turns("b"), salt=None, tenant="b")
        if i == 5:
            store.put("a0", _turns("a"), salt=None, tenant="a")
        store.check_integrity()
    assert store.get("a0", salt=None) is not None and store.tenants() == {"a": 1, "b": 9}
    assert store.get("b30", salt=None) is None and store.get("b31", salt=None) is not None
    sized = ResponseStore(limit=100, max_chars=10_000)
    sized.put("a0", _turns("a" * 1000), salt=None, tenant="a")
    for i in range(10):
        sized.put(f"b{i}", _turns("b" * 100), salt=None, tenant="b")
    for i in range(20):  # a flood in size: its own oldest go
        sized.put(f"c{i}", _turns("c" * 2000), salt=None, tenant="c")
        sized.check_integrity()
        if i == 1:
            assert sized.get("c0", salt=None) is not None  # read: now c's latest used
    assert sized.get("a0", salt=None) is not None
    assert sized.tenants()["b"] == 10 and sized.chars <= 10_000
    assert sized.get("c0", salt=None) is None and sized.get("c19", salt=None) is not None


def test_a_tenant_within_its_part_keeps_its_responses_whatever_others_store() -> None:
    rng = random.Random(7)
    store = ResponseStore(limit=60, max_chars=40_000)
    mine = [f"mine{i}" for i in range(4)]  # fewer and smaller than a 12th of the bounds
    for rid in mine:
        store.put(rid, _turns("m" * 100), salt=None, tenant="me")
    for i in range(3000):
        tenant = rng.choice(["big", "big", "big", "mid", "mid", None, *(f"t{i % 7}",) * 2])
        store.put(f"r{i}", _turns("x" * rng.randrange(0, 2000)), salt=None, tenant=tenant)
        if i % 97 == 0:
            store.check_integrity()
            assert len(store) <= 60 and store.chars <= 40_000
    store.check_integrity()
    assert len(store) == 60 or store.chars > 40_000 - 2_200  # full, by one bound or the other
    assert store.tenants()["me"] == 4
    assert all(store.get(rid, salt=None) is not None for rid in mine)


def test_a_strings_size_is_the_bytes_of_its_characters() -> None:
    store = ResponseStore(limit=8, max_chars=1 << 20)
    store.put("ascii", _turns("a" * 1000), salt=None)
    ascii_size = store.chars
    store.put("astral", _turns("\U0001F600" * 1000), salt=None)  # 4 bytes each
    assert store.chars - ascii_size >= 4000
    store.check_integrity()


@pytest.mark.parametrize(("extra", "param"), [
    ({"conversation": "conv_1"}, "conversation"),
    ({"conversation": {"id": "conv_1"}, "previous_response_id": "resp_x"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"previous_response_id": ""}, "previous_response_id"),
])
def test_what_names_context_the_engine_lacks_is_refused_naming_it(
        serve: Serve, extra: dict[str, Any], param: str) -> None:
    url = serve(_served([]).app).url
    r = httpx.post(f"{url}/v1/responses", json={"input": "x", "max_output_tokens": 1, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    # null is as left out
    nulls = {k: None for k in extra}
    assert httpx.post(f"{url}/v1/responses", json={
        "input": "x", "max_output_tokens": 1, **nulls}).status_code == 200


def _events(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]


def test_a_cut_responses_message_is_incomplete(serve: Serve) -> None:
    url = serve(_served([]).app).url
    with httpx.Client(base_url=url, timeout=30) as http:
        whole = _post(http, None, input="x", max_output_tokens=2).json()
        assert whole["status"] == "incomplete"
        assert [item["status"] for item in whole["output"]] == ["incomplete"]
        events = _events(_post(http, None, input="x", max_output_tokens=2, stream=True))
        done = [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"]
        assert done == ["incomplete"]
        assert events[-1]["response"]["output"][0]["status"] == "incomplete"
        body = {"input": "go on", "stream": True, "max_output_tokens": 300}
        with http.stream("POST", "/v1/responses", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # created
            assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
            cancelled = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    done = [e["item"]["status"] for e in cancelled if e["type"] == "response.output_item.done"]
    last = cancelled[-1]["response"]
    assert done == ["incomplete"] and last["status"] == "cancelled"
    assert last["error"] is None and last["output"][0]["status"] == "incomplete"
