"""``POST /v1/embeddings`` on the engine server (sim executor, a real uvicorn on loopback),
through the official ``openai`` client and raw HTTP: shapes, base64, errors, determinism,
the cost charged and the request metrics."""

from __future__ import annotations

import argparse
import base64
import math
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.cli import add_arguments, build_server, make_executor
from engine.cost_model import CostModel
from engine.embedding_schema import MAX_INPUTS
from engine.sim_embedding import SimEmbedder, seed_of
from kvwire import metric_names as m
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import TINY_GPU, TINY_MODEL
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.waiting import wait_until

MODEL = "tiny-sim"
DIM = 64
LIMIT = 128  # max_model_len
DOC = ("The supplier shall deliver the goods to the buyer's warehouse within thirty days of "
       "the order, and the buyer shall pay within sixty days of delivery.")
SIMILAR = DOC.replace("thirty", "forty")
OTHER = "Quarterly rainfall in the northern valleys exceeded every forecast made in spring."


class Engine(LiveEngine):
    def post(self, **body: Any) -> httpx.Response:
        return self.http.post("/v1/embeddings", json={"model": MODEL, **body})

    def floats(self, inputs: Any, **body: Any) -> list[list[float]]:
        r = self.post(input=inputs, encoding_format="float", **body)
        assert r.status_code == 200, r.text
        return [d["embedding"] for d in r.json()["data"]]

    def metric(self, name: str, **labels: str) -> float:
        want = {"model_name": MODEL, "engine": "0", **labels}
        text = self.http.get("/metrics").text
        return sum(s.value for fam in text_string_to_metric_families(text)
                   for s in fam.samples if s.name == name and s.labels == want)


def _serve(embedder: SimEmbedder | None, **core_kw: Any) -> Iterator[Engine]:
    yield from serve_engine(Engine, MODEL, {"embedder": embedder}, num_blocks=512,
                            max_model_len=LIMIT, **core_kw)


@pytest.fixture(scope="module")
def live() -> Iterator[Engine]:
    yield from _serve(SimEmbedder(DIM, seed_of("tiny")))


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_openai_client_gets_one_unit_vector_per_input(live: Engine) -> None:
    out = live.client.embeddings.create(model=MODEL, input=[DOC, SIMILAR, OTHER, DOC])
    assert out.object == "list" and out.model == MODEL
    assert [d.index for d in out.data] == [0, 1, 2, 3]
    assert all(d.object == "embedding" and len(d.embedding) == DIM for d in out.data)
    vecs = [d.embedding for d in out.data]
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5)
               for v in vecs)
    assert vecs[0] == vecs[3]  # equal texts, equal vectors
    assert cos(vecs[0], vecs[1]) > cos(vecs[0], vecs[2]) + 0.3
    n = [len(live.server.tokenizer.encode(t)) for t in (DOC, SIMILAR, OTHER, DOC)]
    assert out.usage.prompt_tokens == out.usage.total_tokens == sum(n)


def test_body_shape_matches_vllm(live: Engine) -> None:
    r = live.post(input="hello there", user="someone")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    assert body["id"].startswith("embd-") and body["object"] == "list"
    assert body["data"][0].keys() == {"index", "object", "embedding"}
    n = len(live.server.tokenizer.encode("hello there"))
    assert body["usage"] == {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
                             "prompt_tokens_details": None}


def test_base64_is_the_float32_vector(live: Engine) -> None:
    (floats,) = live.floats([DOC])
    r = live.post(input=[DOC], encoding_format="base64")
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert len(raw) == 4 * DIM
    decoded = struct.unpack(f"<{DIM}f", raw)
    assert decoded == pytest.approx(floats, abs=1e-7)
    # the openai client asks for base64 by default and decodes it itself
    client = live.client.embeddings.create(model=MODEL, input=DOC).data[0].embedding
    assert client == pytest.approx(floats, abs=1e-7)


def test_token_id_inputs_equal_their_text(live: Engine) -> None:
    ids = live.server.tokenizer.encode(DOC)
    (by_text,) = live.floats(DOC)
    (by_ids,) = live.floats(ids)
    assert by_ids == by_text
    both = live.floats([ids, ids[:10]])
    assert both[0] == by_text and both[1] != by_text
    out = live.client.embeddings.create(model=MODEL, input=[ids, ids[:10]])
    assert out.usage.prompt_tokens == len(ids) + 10


def test_dimensions_shorten_the_vector(live: Engine) -> None:
    (full,) = live.floats(DOC)
    (short,) = live.floats(DOC, dimensions=8)
    assert len(short) == 8
    scale = math.sqrt(sum(x * x for x in full[:8]))
    assert short == pytest.approx([x / scale for x in full[:8]], abs=1e-9)
    out = live.client.embeddings.create(model=MODEL, input=DOC, dimensions=DIM)
    assert out.data[0].embedding == pytest.approx(full, abs=1e-7)


def test_truncate_prompt_tokens_keeps_the_last_tokens(live: Engine) -> None:
    ids = list(range(300, 300 + LIMIT + 20))
    assert live.post(input=ids).status_code == 400
    (kept,) = live.floats(ids, truncate_prompt_tokens=-1)
    assert kept == live.floats(ids[-LIMIT:])[0]
    (five,) = live.floats(ids, truncate_prompt_tokens=5)
    assert five == live.floats(ids[-5:])[0]


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": ""}, "input", "empty string"),
    ({"input": ["ok", ""]}, "input", "input 1 is an empty string"),
    ({"input": []}, "input", "non-empty"),
    ({}, "input", "required"),
    ({"input": 7}, "input", "must be"),
    ({"input": ["a", 3]}, "input", "must be"),
    ({"input": [[1, 2], []]}, "input", "input 1"),
    ({"input": [[1, 2], [-1]]}, "input", "input 1"),
    ({"input": [True, 2]}, "input", "must be"),
    ({"input": ["x"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
    ({"input": list(range(300, 300 + LIMIT + 1))}, "input",
     f"maximum context length is {LIMIT} tokens. However, you requested {LIMIT + 1} tokens "
     "in the input for embedding generation"),
    ({"input": [[5000]]}, "input", "outside the vocabulary"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "must be one of"),
    ({"input": "x", "encoding_format": 1}, "encoding_format", "must be str"),
    ({"input": "x", "dimensions": 0}, "dimensions", "positive"),
    ({"input": "x", "dimensions": DIM + 1}, "dimensions", f"at most {DIM}"),
    ({"input": "x", "dimensions": "eight"}, "dimensions", "must be int"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "-1 or"),
    ({"input": "x", "truncate_prompt_tokens": LIMIT + 1}, "truncate_prompt_tokens",
     "greater than max_model_len"),
    ({"input": "x", "model": 5}, "model", "must be a string"),
])
def test_bad_requests_get_a_400_naming_the_field(live: Engine, body: dict[str, Any],
                                                 param: str, words: str) -> None:
    r = live.http.post("/v1/embeddings", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert words in err["message"]


def test_unknown_model_and_bad_json(live: Engine) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        live.client.embeddings.create(model="nope", input="x")
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]
    r = live.http.post("/v1/embeddings", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    # an empty name is the served model's, as vLLM reads it
    r = live.http.post("/v1/embeddings", json={"model": "", "input": "x"})
    assert r.status_code == 200 and r.json()["model"] == MODEL, r.text


def test_requests_count_in_the_engine_metrics_and_take_prefill_time() -> None:
    for engine in _serve(SimEmbedder(DIM, seed_of("tiny"))):
        stops = engine.metric(m.REQUEST_SUCCESS + "_total", finished_reason="stop")
        ids = [list(range(300, 300 + LIMIT)), list(range(1000, 1000 + LIMIT))]
        out = engine.client.embeddings.create(model=MODEL, input=ids)
        assert len(out.data) == 2
        assert engine.metric(m.REQUEST_SUCCESS + "_total", finished_reason="stop") \
            == stops + 2
        assert engine.metric(m.PROMPT_TOKENS + "_total") == 2 * LIMIT
        assert engine.metric(m.GENERATION_TOKENS + "_total") == 0
        assert engine.metric(m.REQUEST_PROMPT_TOKENS + "_count") == 2
        assert engine.metric(m.REQUEST_GENERATION_TOKENS + "_count") == 0
        assert engine.metric(m.TTFT + "_count") == 0
        # both prefills ran as one modeled step, and the server slept for it
        step = CostModel(TINY_MODEL, TINY_GPU).step_seconds([(0, LIMIT), (0, LIMIT)])
        assert engine.metric(m.REQUEST_PREFILL_TIME + "_sum") >= 2 * step * 0.99
        assert engine.metric(m.E2E_LATENCY + "_count") == 2
        assert engine.metric(m.NUM_REQUESTS_RUNNING) == 0


def test_an_engine_without_an_embedder_says_so() -> None:
    for engine in _serve(None):
        with pytest.raises(openai.BadRequestError) as info:
            engine.client.embeddings.create(model=MODEL, input="x")
        err = info.value.body
        assert isinstance(err, dict) and err["param"] == "model"
        assert "does not support Embeddings API" in err["message"]
        # completions still work there
        done = engine.client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert done.usage is not None and done.usage.completion_tokens == 2


def test_a_client_that_leaves_aborts_what_is_not_embedded_yet() -> None:
    # 8 tokens a step, ~1 ms a step: 200 inputs of 128 tokens take ~3 s of steps
    for engine in _serve(SimEmbedder(DIM, seed_of("tiny")), max_num_batched_tokens=8):
        ids = [list(range(300 + i, 300 + i + LIMIT)) for i in range(200)]
        with pytest.raises(httpx.ReadTimeout):
            engine.http.post("/v1/embeddings", json={"model": MODEL, "input": ids},
                             timeout=0.5)

        def drained(e: Engine = engine) -> bool:
            return e.metric(m.NUM_REQUESTS_RUNNING) + e.metric(m.NUM_REQUESTS_WAITING) == 0

        wait_until(drained, 10, "the engine to drop the abandoned inputs")
        core = engine.server.core
        stopped = engine.metric(m.REQUEST_SUCCESS + "_total", finished_reason="stop")
        aborted = engine.metric(m.REQUEST_SUCCESS + "_total", finished_reason="abort")
        assert aborted > 100 and stopped + aborted == 200
        core.check_integrity()
        assert core.kv.usage() == 0.0


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_cli_gives_sim_engines_an_embedder_of_the_model_width() -> None:
    server = build_server(_args("--kv-cache-gib", "0.1"))
    assert server.embedder is not None and server.embedder.dim == 4096  # Llama-3-8B
    narrow = build_server(_args("--kv-cache-gib", "0.1", "--embedding-dim", "256"))
    assert narrow.embedder.dim == 256
    with pytest.raises(ValueError, match="embedding_dim must be >= 1"):
        build_server(_args("--kv-cache-gib", "0.1", "--embedding-dim", "0"))
    with pytest.raises(ValueError, match="sim executor only"):
        make_executor(_args("--executor", "torch", "--model", "/nowhere", "--embedding-dim",
                            "8"), load_tokenizer(None))
