"""Replicas of one model that hold different contexts (a rolling change of
``--max-model-len``, a mixed fleet): ``/v1/models`` states the shortest context among the
healthy ones, and a replica's refusal of a prompt as longer than its context goes on to a
replica that holds a longer one, within the request's tries."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet, ModelInfo
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.gateway_harness import Gateway, Serve, metric, start_gateway
from tests.support.waiting import wait_until

MODEL = "llama"
PROMPT = "word " * 100  # ~200 of the sim engine's tokens: over 128, within 512


def _advertised(gw: Gateway) -> int | None:
    listed = httpx.get(gw.url + "/v1/models").json()["data"]
    return next((m.get("max_model_len") for m in listed if m["id"] == MODEL), None)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[LiveEngine, LiveEngine]]:
    """Sim engines serving MODEL with 512 and 128 tokens of context."""
    big = serve_engine(LiveEngine, MODEL, max_model_len=512)
    small = serve_engine(LiveEngine, MODEL, max_model_len=128)
    try:
        yield next(big), next(small)
    finally:
        big.close()
        small.close()


def test_engine_refusal_goes_on_to_the_longer_context(
        serve: Serve, engines: tuple[LiveEngine, LiveEngine]) -> None:
    big, small = engines
    # the longer one listed first: its context is what the list showed
    gw = start_gateway(serve, [("big", big.url), ("small", small.url)])
    wait_until(lambda: _advertised(gw) is not None, what="the model listed")
    assert _advertised(gw) == 128
    one = httpx.get(f"{gw.url}/v1/models/{MODEL}").json()
    assert one["max_model_len"] == 128
    answered: Counter[tuple[int, str | None]] = Counter()
    for _ in range(6):  # round robin: every other request is first sent to "small"
        r = httpx.post(gw.url + "/v1/completions", timeout=30,
                       json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
        answered[r.status_code, r.headers.get("x-kvgate-replica")] += 1
    assert answered == {(200, "big"): 6}
    # round robin turns at each try: which request "small" saw first is the policy's
    retried = metric(gw, 'kvgate_retries_total{cause="context_length",replica="small"}')
    assert retried is not None and 1 <= retried <= 6
    # a prompt neither holds: the longest context's refusal, the replica's own words
    r = httpx.post(gw.url + "/v1/completions", timeout=30,
                   json={"model": MODEL, "prompt": PROMPT * 3, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert "maximum context length is 512 tokens" in r.json()["error"]["message"]
    # refusals are the request's, not the replica's: "small" is still in the list
    assert _advertised(gw) == 128


@dataclass
class Replica:
    """A replica listing MODEL with ``max_model_len``, refusing a prompt of more words
    than that in one of vLLM's words (``shape``), or as llama.cpp's server does."""

    max_model_len: int
    shape: str = "nested"
    healthy: bool = True
    prompts: list[int] = field(default_factory=list)  # words of each prompt it got


def _message(limit: int, words: int, shape: str) -> str:
    if shape == "llamacpp":  # llama.cpp's server: its n_ctx beside (``_app``)
        return "the request exceeds the available context size, try increasing it"
    if shape == "v1":  # vLLM V1's input processor
        return (f"The decoder prompt (length {words}) is longer than the maximum model "
                f"length of {limit}. Make sure that `max_model_len` is no smaller than the "
                "number of text tokens.")
    return (f"This model's maximum context length is {limit} tokens. However, your "
            f"request has {words} input tokens. Please reduce the length of the input "
            "messages.")


def _app(replica: Replica) -> Starlette:
    async def complete(request: Request) -> Response:
        body = await request.json()
        words = len(body["prompt"].split())
        replica.prompts.append(words)
        if words > replica.max_model_len and replica.shape == "llamacpp":
            return JSONResponse({"error": {
                "code": 400, "message": _message(replica.max_model_len, words, replica.shape),
                "type": "exceed_context_size_error",
                "n_prompt_tokens": words, "n_ctx": replica.max_model_len}}, status_code=400)
        if words > replica.max_model_len:
            error = {"message": _message(replica.max_model_len, words, replica.shape),
                     "type": "BadRequestError", "param": None, "code": 400}
            # vLLM since 0.10.2 nests it under "error"; older vLLM's is flat
            return JSONResponse({"object": "error", **error} if replica.shape == "flat"
                                else {"error": error}, status_code=400)
        return JSONResponse({"id": "x", "object": "text_completion", "created": 0,
                             "model": MODEL, "choices": [{"index": 0, "text": "ok",
                                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": words, "completion_tokens": 1,
                                       "total_tokens": words + 1}})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok", status_code=200 if replica.healthy else 503)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "vllm", "root": MODEL,
             "parent": None, "max_model_len": replica.max_model_len}]})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse("")

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/health", health), Route("/v1/models", models),
                             Route("/metrics", metrics)])


def _post(gw: Gateway, words: int) -> httpx.Response:
    return httpx.post(gw.url + "/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": "w " * words, "max_tokens": 1})


@pytest.mark.parametrize("shape", ["nested", "flat", "v1", "llamacpp"])
def test_vllm_refusals_go_on_to_a_longer_context(serve: Serve, shape: str) -> None:
    # contexts the 300-word prompt exceeds by less than the margin the gateway allows its
    # estimate (clearly exceeded, a replica is tried after the others: never refused)
    short, mid, long = Replica(250, shape), Replica(280, shape), Replica(400, shape)
    gw = start_gateway(serve, [(name, serve(_app(r)).url) for name, r in
                               (("short", short), ("mid", mid), ("long", long))])
    wait_until(lambda: _advertised(gw) == 250, what="the shortest context listed")
    got = [(r.status_code, r.headers.get("x-kvgate-replica"))
           for r in (_post(gw, 300) for _ in range(3))]
    assert got == [(200, "long")] * 3
    # a request first sent to "short" went on to "mid" (its context is longer than 250),
    # whose refusal sent it on to "long": three tries, the default max_attempts
    assert long.prompts == [300] * 3 and short.prompts and short.prompts == [300] * len(
        short.prompts) and mid.prompts == [300] * len(mid.prompts)
    for name, refused in (("short", short), ("mid", mid)):
        assert metric(gw, f'kvgate_retries_total{{cause="context_length",replica="{name}"}}'
                      ) == len(refused.prompts)
    # a prompt none holds: the longest context's refusal, in the replica's words
    r = _post(gw, 500)
    assert r.status_code == 400, r.text
    refusal = r.json()  # relayed as the replica wrote it
    assert refusal.get("error", refusal)["message"] == _message(400, 500, shape)
    assert long.prompts[-1] == 500


def test_refusal_stays_within_the_tries(serve: Serve) -> None:
    short, long = Replica(250), Replica(400)  # within the estimate's margin (above)
    gw = start_gateway(serve, [("short", serve(_app(short)).url),
                               ("long", serve(_app(long)).url)], max_attempts=1)
    wait_until(lambda: _advertised(gw) == 250, what="the shortest context listed")
    got = Counter(_post(gw, 300).status_code for _ in range(4))
    assert got == {200: 2, 400: 2}  # one try each: "short"'s refusal is the answer
    assert len(short.prompts) == len(long.prompts) == 2


def test_card_states_the_healthy_replicas_shortest_context(serve: Serve) -> None:
    long, short = Replica(8192), Replica(1024)
    gw = start_gateway(serve, [("long", serve(_app(long)).url),
                               ("short", serve(_app(short)).url)])
    wait_until(lambda: _advertised(gw) == 1024, what="the shortest context listed")
    short.healthy = False  # out of routing: requests no longer reach it
    wait_until(lambda: _advertised(gw) == 8192, what="the healthy replica's context")
    short.healthy = True
    wait_until(lambda: _advertised(gw) == 1024, what="the readmitted replica's context")


def test_advertised_follows_listings_health_and_partition() -> None:
    fleet = Fleet([ReplicaConfig(rid, f"http://127.0.0.1:{port}")
                   for rid, port in (("a", 9001), ("b", 9002), ("c", 9003))])
    a, b, c = (fleet.get(rid) for rid in "abc")
    assert a is not None and b is not None and c is not None
    a.model_info = {MODEL: ModelInfo(None, None, 8192), "lora": ModelInfo("/l", MODEL, None)}
    b.model_info = {MODEL: ModelInfo(None, None, 1024)}
    c.model_info = {"other": ModelInfo(None, None, 2048)}
    cards = fleet.advertised()
    assert cards == {MODEL: ModelInfo(None, None, 1024), "lora": ModelInfo("/l", MODEL, None),
                     "other": ModelInfo(None, None, 2048)}
    assert fleet.advertised() is cards  # nothing changed: the same answer
    b.model_info = {MODEL: ModelInfo(None, None, 4096)}  # restarted with a longer context
    assert fleet.advertised()[MODEL].max_model_len == 4096
    b.healthy = False
    assert fleet.advertised()[MODEL].max_model_len == 8192
    a.healthy = False  # none healthy lists it: the first listing stands
    assert fleet.advertised()[MODEL].max_model_len == 8192
    a.healthy = b.healthy = True
    assert fleet.advertised(lambda rid: rid != "a") == {
        MODEL: ModelInfo(None, None, 4096), "other": ModelInfo(None, None, 2048)}
