"""``stop_token_ids`` holds token ids of the vocabulary, as a prompt's ids: a negative id,
one past the vocabulary, or an integer past 64 bits (which JSON decoding reads as a
float) is refused with a 400 naming the value and the vocabulary's range, on the OpenAI
routes and SGLang's /generate; before, a negative id was taken silently and 10**30 was
refused as "must be a list of integers"."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from engine.server import EngineServer, build_app
from tests.support.engine_servers import running_engine

MODEL = "tiny-sim"


@pytest.fixture
async def engine() -> AsyncIterator[tuple[httpx.AsyncClient, int]]:
    """A client of a running sim engine's app, and its vocabulary's size."""
    async with running_engine(MODEL) as srv:
        server: EngineServer = srv
        transport = httpx.ASGITransport(app=build_app(server))
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
            yield client, server.vocab_size


def _raw(ids: str) -> bytes:
    return (b'{"model": "%s", "prompt": "hi", "max_tokens": 2, "stop_token_ids": [%s]}'
            % (MODEL.encode(), ids.encode()))


@pytest.mark.parametrize(("sent", "named"), [
    ("-5", "-5"), ("1000000000000000000000000000000", "about 1e+30"),
    ("18446744073709551616", "about 1.84467e+19"), ("VOCAB", "VOCAB")])
async def test_an_id_outside_the_vocabulary_is_refused_naming_it(
        engine: tuple[httpx.AsyncClient, int], sent: str, named: str) -> None:
    client, vocab = engine
    sent, named = sent.replace("VOCAB", str(vocab)), named.replace("VOCAB", str(vocab))
    r = await client.post("/v1/completions", content=_raw(f"3, {sent}"),
                          headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "stop_token_ids"
    assert error["message"] == (f"token id {named} in 'stop_token_ids' is outside the "
                                f"vocabulary [0, {vocab})")


async def test_chat_and_generate_refuse_a_negative_id_too(
        engine: tuple[httpx.AsyncClient, int]) -> None:
    client, vocab = engine
    r = await client.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "stop_token_ids": [-1]})
    assert r.status_code == 400 and "token id -1 in 'stop_token_ids'" in r.text, r.text
    r = await client.post("/generate", json={"text": "hi", "sampling_params": {
        "max_new_tokens": 2, "stop_token_ids": [-1]}})
    assert r.status_code == 400 and f"token id -1 in 'stop_token_ids' is outside the " \
        f"vocabulary [0, {vocab})" in r.text, r.text


async def test_ids_in_the_vocabulary_are_taken_and_others_named(
        engine: tuple[httpx.AsyncClient, int]) -> None:
    client, vocab = engine
    r = await client.post("/v1/completions", json={
        "model": MODEL, "prompt": "hi", "max_tokens": 2, "stop_token_ids": [0, vocab - 1]})
    assert r.status_code == 200, r.text
    r = await client.post("/v1/completions", json={
        "model": MODEL, "prompt": "hi", "max_tokens": 2, "stop_token_ids": [3, "x"]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == \
        "'stop_token_ids' must be a list of integers, got 'x' in it"
