"""One tenant cannot take over another's stored response (``/v1/responses``) in front of a
replica that names a response after the request's id, as vLLM does: the request is
refused, or, under a name the gateway cannot foresee, its record of whose the response
is stands."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.gateway_harness import Serve, start_gateway
from tests.support.tenant_responses import API_KEYS, KEY_A, KEY_B, MODEL, post_response


def _named_by_request_id() -> tuple[Starlette, dict[str, list[str]], list[bytes]]:
    """A replica that stores each response under the request's ``request_id`` (vLLM's
    way), or ``resp_`` and it where it does not start so, its answer the inputs of the
    conversation so far; its store and the bodies it received."""
    store: dict[str, list[str]] = {}
    received: list[bytes] = []

    async def respond(request: Request) -> Response:
        raw = await request.body()
        received.append(raw)
        body = json.loads(raw)
        previous = body.get("previous_response_id")
        if previous is not None and previous not in store:
            return JSONResponse({"error": {
                "message": f"Response with id '{previous}' not found.",
                "type": "invalid_request_error", "param": "previous_response_id",
                "code": None}}, status_code=404)
        given = body.get("request_id")
        name = f"resp_{uuid.uuid4().hex}" if given is None \
            else given if given.startswith("resp_") else f"resp_{given}"
        store[name] = (store[previous] if previous else []) + [body["input"]]
        return JSONResponse({
            "id": name, "object": "response", "status": "completed", "model": MODEL,
            "output": [{"type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "annotations": [],
                                     "text": json.dumps(store[name])}]}],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def ok(request: Request) -> Response:
        return PlainTextResponse("")

    app = Starlette(routes=[Route("/v1/responses", respond, methods=["POST"]),
                            Route("/v1/models", models), Route("/health", ok),
                            Route("/metrics", ok)])
    return app, store, received


def _said(answer: httpx.Response) -> Any:
    assert answer.status_code == 200, answer.text
    return json.loads(answer.json()["output"][0]["content"][0]["text"])


def test_another_tenant_cannot_take_over_a_response_id(serve: Serve) -> None:
    app, store, received = _named_by_request_id()
    gw = start_gateway(serve, [("v", serve(app).url)], auth=API_KEYS)
    with httpx.Client(base_url=gw.url, timeout=30) as client:
        first = post_response(client, KEY_A, input="A1")
        assert _said(first) == ["A1"]
        secret = first.json()["id"]
        sent = len(received)
        # tenant B names its request after A's response: refused, in the body or the
        # header, before any replica could replace A's stored response with B's
        for taking in ({"request_id": secret}, {}):
            headers = {"authorization": f"Bearer {KEY_B}"}
            if not taking:
                headers["x-request-id"] = secret
            taken = client.post("/v1/responses", headers=headers, json={
                "model": MODEL, "max_output_tokens": 2, "input": "B1", **taking})
            assert taken.status_code == 400, taken.text
            error = taken.json()["error"]
            assert (error["param"], error["code"]) == ("request_id", "request_id_in_use")
        assert len(received) == sent and store[secret] == ["A1"]
        assert _said(post_response(client, KEY_A, input="A2",
                                   previous_response_id=secret)) == ["A1", "A2"]
        # its own tenant may name a request after its own response
        again = post_response(client, KEY_A, input="A3", request_id=secret)
        assert _said(again) == ["A3"] and again.json()["id"] == secret
        # a name the gateway cannot foresee (the replica adds ``resp_``): B's answer is
        # relayed, and the response stays A's
        under = post_response(client, KEY_B, input="B2", request_id=secret[len("resp_"):])
        assert under.json()["id"] == secret and _said(under) == ["B2"]
        refused = post_response(client, KEY_B, input="B3", previous_response_id=secret)
        assert refused.status_code == 404, refused.text
        assert refused.json()["error"]["param"] == "previous_response_id"
        went_on = post_response(client, KEY_A, input="A4", previous_response_id=secret)
        assert went_on.status_code == 200, went_on.text
