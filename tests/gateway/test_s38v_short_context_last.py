"""A ranked replica whose context (the ``max_model_len`` its ``/v1/models`` gives) the
prompt clearly exceeds is tried after the others: a replica restarted with a tiny context
no longer draws, and refuses, every long prompt the policy ranks it first for. Where every
ranked replica is that short, the policy's order stands and the replica's refusal
answers."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.gateway_harness import Gateway, Serve, metric, start_gateway
from tests.support.waiting import wait_until

MODEL = "llama"
PROMPT = "word " * 100  # 100 of the replicas' tokens (one a word)


@dataclass
class Replica:
    """Serves MODEL with ``max_model_len`` tokens of context, a word a token, refusing a
    longer prompt in vLLM's words."""

    max_model_len: int
    prompts: list[int] = field(default_factory=list)  # words of each prompt it got


def _app(replica: Replica) -> Starlette:
    async def complete(request: Request) -> Response:
        words = len((await request.json())["prompt"].split())
        replica.prompts.append(words)
        if words > replica.max_model_len:
            return JSONResponse({"error": {
                "message": f"This model's maximum context length is {replica.max_model_len}"
                           f" tokens. However, your request has {words} input tokens.",
                "type": "BadRequestError", "param": None, "code": 400}}, status_code=400)
        return JSONResponse({"id": "x", "object": "text_completion", "created": 0,
                             "model": MODEL, "choices": [{"index": 0, "text": "ok",
                                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": words, "completion_tokens": 1,
                                       "total_tokens": words + 1}})

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "root": MODEL, "parent": None,
             "max_model_len": replica.max_model_len}]})

    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def metrics(request: Request) -> Response:
        return PlainTextResponse("")

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/v1/models", models), Route("/health", ok),
                             Route("/metrics", metrics)])


def _gateway(serve: Serve, replicas: dict[str, Replica]) -> Gateway:
    gw = start_gateway(serve, [(rid, serve(_app(r)).url) for rid, r in replicas.items()])
    shortest = min(r.max_model_len for r in replicas.values())

    def listed() -> bool:
        data = httpx.get(f"{gw.url}/v1/models").json()["data"]
        return any(m.get("max_model_len") == shortest for m in data)

    wait_until(listed, 10, "every replica's context known")
    return gw


def _complete(gw: Gateway) -> httpx.Response:
    return httpx.post(f"{gw.url}/v1/completions", timeout=10,
                      json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1})


def test_a_replica_too_short_for_the_prompt_is_tried_after_the_others(serve: Serve) -> None:
    small, big = Replica(10), Replica(4096)
    gw = _gateway(serve, {"small": small, "big": big})
    for _ in range(6):  # round robin ranks "small" first for every other request
        r = _complete(gw)
        assert r.status_code == 200 and r.headers["x-kvgate-replica"] == "big", r.text
    assert small.prompts == [] and big.prompts == [100] * 6
    assert not metric(gw, 'kvgate_retries_total{cause="context_length",replica="small"}')
    moved = metric(gw, 'kvgate_short_context_total{replica="small"}')
    assert moved is not None and 1 <= moved <= 6
    assert not metric(gw, 'kvgate_short_context_total{replica="big"}')


def test_where_every_replica_is_too_short_the_refusal_answers(serve: Serve) -> None:
    # a control: the code before the rule answered so too; with it, no replica moves
    one, two = Replica(10), Replica(20)
    gw = _gateway(serve, {"one": one, "two": two})
    r = _complete(gw)
    assert r.status_code == 400
    # the policy's first choice refused it ("one" goes on to the longer "two")
    assert "maximum context length is 20 tokens" in r.json()["error"]["message"]
    assert two.prompts == [100] and one.prompts in ([], [100])
    assert not metric(gw, 'kvgate_short_context_total{replica="one"}')
    assert not metric(gw, 'kvgate_short_context_total{replica="two"}')
