"""Whatever a client sends, the engine and the gateway in front of it answer without a
5xx, and every error is an OpenAI error body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server import EngineServer, build_app
from engine.sim_embedding import SimEmbedder, seed_of
from gateway.app import create_app
from gateway.config import parse_config
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.servers import ThreadServer

MODEL = "fuzz-sim"
FIELDS = ("model", "prompt", "messages", "max_tokens", "stream", "temperature", "top_p", "n",
          "stop", "seed", "cache_salt", "tools", "logprobs", "stream_options",
          "max_completion_tokens")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "bogus"])},
    optional={"content": st.one_of(st.text(max_size=30), values)}), max_size=3)
bodies = st.fixed_dictionaries({}, optional={
    **{k: values for k in FIELDS},
    "model": st.one_of(st.just(MODEL), values),
    "prompt": st.one_of(st.text(max_size=40), st.lists(st.integers(-5, 2**33), max_size=5),
                        values),
    "messages": st.one_of(messages, values),
    "max_tokens": st.one_of(st.integers(-3, 8), values),
})
embedding_bodies = st.fixed_dictionaries({}, optional={
    "model": st.one_of(st.just(MODEL), values),
    "input": st.one_of(st.text(max_size=40), st.lists(st.text(max_size=10), max_size=4),
                       st.lists(st.integers(-5, 2**33), max_size=5),
                       st.lists(st.lists(st.integers(-5, 5000), max_size=4), max_size=3),
                       values),
    "encoding_format": st.one_of(st.sampled_from(["float", "base64"]), values),
    "dimensions": st.one_of(st.integers(-2, 40), values),
    "truncate_prompt_tokens": st.one_of(st.integers(-2, 300), values),
    "user": values,
})
raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"[" * 5000 + b"]" * 5000, b'{"model": "\\ud800", "prompt": "x"}',
                     b'{"model": "' + MODEL.encode() + b'", "prompt": "\\udfff\\ud800"}',
                     b"\xff\xfe{}", b'{"prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}",
                     b"null", b"1e999999", b'"just a string"']))


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, str]]:
    core = make_core(num_blocks=256, block_size=4, vocab=(259, 4096), max_model_len=256)
    engine = ThreadServer(build_app(EngineServer(
        core, load_tokenizer(None), model_name=MODEL, sleep_modeled_time=False,
        embedder=SimEmbedder(32, seed_of(MODEL))))).start()
    config = parse_config({"replicas": [{"id": "e", "url": engine.url}],
                           "scrape": {"enabled": False},
                           "policy": {"name": "prefix_affinity"}})
    gateway = ThreadServer(create_app(config)).start()
    try:
        yield engine.url, gateway.url
    finally:
        gateway.stop()
        engine.stop()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One client for every example: a client of its own each costs more than the request."""
    with httpx.Client(timeout=30) as client:
        yield client


def check(http: httpx.Client, url: str, path: str, content: bytes) -> None:
    r = http.post(f"{url}{path}", content=content,
                  headers={"content-type": "application/json"})
    assert r.status_code < 500, (path, content[:200], r.status_code, r.text[:300])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, chat=st.booleans())
def test_json_bodies(servers: tuple[str, str], http: httpx.Client, body: dict[str, Any],
                     chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    content = json.dumps(body, allow_nan=True).encode()
    for url in servers:
        check(http, url, path, content)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(content=raw_bodies, chat=st.booleans())
def test_raw_bodies(servers: tuple[str, str], http: httpx.Client, content: bytes,
                    chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    for url in servers:
        check(http, url, path, content)
        check(http, url, "/v1/embeddings", content)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=embedding_bodies)
def test_embedding_bodies(servers: tuple[str, str], http: httpx.Client,
                          body: dict[str, Any]) -> None:
    content = json.dumps(body, allow_nan=True).encode()
    for url in servers:
        check(http, url, "/v1/embeddings", content)
