"""``/v1/embeddings`` refuses inputs holding more than 300,000 tokens in all (400 naming the
bound, the inputs read and their tokens) as soon as those it has encoded pass it: a batch of
many inputs, each within the context, is not encoded whole first, with or without
``truncate_prompt_tokens``. A batch that fits, up to the bound's last token, is encoded
exactly and served."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from engine.embedding_schema import MAX_INPUTS, MAX_TOTAL_TOKENS
from engine.generate_params import TooManyTokens
from engine.server import EngineServer, build_app
from engine.sim_embedding import SimEmbedder, seed_of
from kvwire.bounded_encoding import WHOLE_PIECE_CHARS
from kvwire.tokenizer import PromptTokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.engine_servers import served_core
from tests.support.recording_tokenizer import RecordingTokenizer

TEXT = "ab " * 250  # 750 characters, 500 tokens: within the context of 512
TEXT_TOKENS = 500
# the inputs whose tokens pass the bound, and what the tokenizer may read of a batch past
# it: their characters and one group more (``BoundedEncoder.encode_many_in_all``)
PASSING = MAX_TOTAL_TOKENS // TEXT_TOKENS + 1
READ_BOUND = PASSING * len(TEXT) + WHOLE_PIECE_CHARS


def _tokenizer() -> PromptTokenizer:
    return PromptTokenizer(Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json")))


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, RecordingTokenizer]]:
    recording = RecordingTokenizer(Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json")))
    srv = EngineServer(served_core(num_blocks=512), PromptTokenizer(recording),
                       model_name="tiny", sleep_modeled_time=False,
                       embedder=SimEmbedder(8, seed_of("tiny")))
    await srv.engine.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(srv)),
                                     base_url="http://engine", timeout=60) as http:
            yield http, recording
    finally:
        await srv.engine.stop()


async def _embed(http: httpx.AsyncClient, recording: RecordingTokenizer,
                 body: dict[str, Any]) -> httpx.Response:
    recording.given.clear()
    return await http.post("/v1/embeddings", json={"model": "tiny", **body})


@pytest.mark.parametrize("extra", [{}, {"truncate_prompt_tokens": -1}],
                         ids=["whole", "truncated"])
async def test_inputs_past_the_bound_in_all_are_refused_once_those_read_pass_it(
        extra: dict[str, Any]) -> None:
    assert len(_tokenizer().encode(TEXT)) == TEXT_TOKENS
    async with served() as (http, recording):
        r = await _embed(http, recording, {"input": [TEXT] * MAX_INPUTS, **extra})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "input"
        assert f"more than {MAX_TOTAL_TOKENS} tokens in all" in error["message"]
        # the count: the inputs up to the one that passes the bound, and their tokens
        counted = re.search(r"inputs 0\.\.(\d+) hold at least (\d+) tokens", error["message"])
        assert counted is not None, error["message"]
        assert int(counted[1]) == PASSING - 1
        assert MAX_TOTAL_TOKENS < int(counted[2]) <= PASSING * TEXT_TOKENS
        # some 1,000,000 tokens sent: no more read than the bound's and one group
        assert sum(recording.given) <= READ_BOUND < MAX_INPUTS * len(TEXT)


async def test_a_batch_up_to_the_bound_is_encoded_exactly() -> None:
    async with served() as (http, recording):
        fits = MAX_TOTAL_TOKENS // TEXT_TOKENS
        r = await _embed(http, recording, {"input": [TEXT] * fits})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == MAX_TOTAL_TOKENS
        # each text's vector is that of its exact ids (the text's encoded alone)
        alone = await _embed(http, recording, {"input": [_tokenizer().encode(TEXT)]})
        data = r.json()["data"]
        assert {tuple(d["embedding"]) for d in data} == \
            {tuple(alone.json()["data"][0]["embedding"])}


def test_encoding_many_in_all_stops_at_the_text_that_passes_a_bound() -> None:
    bounded = _tokenizer().bounded
    short = "ab " * 10  # 20 tokens
    texts = [short] * 5
    assert [got.ids for got in bounded.encode_many_in_all(texts, 512, 100)] == \
        [bounded.encode(short)] * 5  # all fit (100 in all): each encoded exactly
    passed = bounded.encode_many_in_all(texts, 512, 45)
    assert [got.at_least for got in passed] == [20, 20, 20]  # the third takes it past 45
    huge = "ab " * 100_000
    proven = bounded.encode_many_in_all([short, huge, short], 512, 100_000)
    assert len(proven) == 2 and proven[1].ids is None and proven[1].at_least > 512
    left = bounded.encode_many_in_all([short, huge], 1 << 20, 300)
    assert len(left) == 2 and left[1].ids is None and 20 + left[1].at_least > 300


async def test_token_id_inputs_past_the_bound_in_all_are_refused_with_their_count() -> None:
    async with served() as (http, recording):
        r = await _embed(http, recording, {"input": [[7] * TEXT_TOKENS] * MAX_INPUTS})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "input"
        assert error["message"].startswith(
            f"inputs 0..{PASSING - 1} hold at least {PASSING * TEXT_TOKENS} tokens, more "
            f"than {MAX_TOTAL_TOKENS} tokens in all"), error["message"]


async def test_a_short_batch_encoded_on_the_event_loop_is_bounded_in_all_too() -> None:
    srv = EngineServer(served_core(num_blocks=64), _tokenizer(), model_name="tiny",
                       sleep_modeled_time=False)
    short = "ab " * 10  # 20 tokens; three of them well within the inline characters
    assert await srv.encode_texts([short] * 3, within=512, in_all=60) == \
        [_tokenizer().encode(short)] * 3
    # each counted whole, or to its last ``keep``: the first to take the sum past names it
    for keep, in_all, index, at_least in [(None, 59, 2, 60), (15, 50, 3, 60)]:
        with pytest.raises(TooManyTokens) as refused:
            await srv.encode_texts([short] * 5, within=512, keep=keep, in_all=in_all)
        assert (refused.value.index, refused.value.at_least, refused.value.in_all) == \
            (index, at_least, True)
    with pytest.raises(AssertionError, match="in_all"):  # no bound to keep it with
        await srv.encode_texts([short], in_all=10)
