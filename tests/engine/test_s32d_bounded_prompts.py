"""A prompt far longer than the model's context is refused (400, vLLM's or SGLang's words,
its count "at least" what was proven) reading a bounded part of it: the tokenizer is never
given the whole text, on every route that encodes client text. A prompt that fits, up to
the context's last token, is still encoded whole and served."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from engine.server import EngineServer, build_app
from engine.sim_embedding import SimEmbedder, seed_of
from kvwire.tokenizer import PromptTokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.engine_servers import served_core
from tests.support.recording_tokenizer import RecordingTokenizer

HUGE = "ab " * 1_500_000  # 4.3 MiB, some 3,000,000 tokens
CONTEXT = 512  # served_core's max_model_len
# what the tokenizer may read of a refused prompt: a few pieces of 3 x 513 + 4,096 chars
READ_BOUND = 32_768
LONG_WORD = " strountdeesdroungtrainding"  # one token of 27 characters


class Engine:
    def __init__(self, http: httpx.AsyncClient, recording: RecordingTokenizer,
                 tokenizer: PromptTokenizer, max_model_len: int) -> None:
        self.http, self.recording, self.tokenizer = http, recording, tokenizer
        self.max_model_len = max_model_len

    async def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        self.recording.given.clear()
        return await self.http.post(path, json={"model": "tiny", **body})


@contextlib.asynccontextmanager
async def served(longest_known: bool, **core_kw: Any) -> AsyncIterator[Engine]:
    """A ``served_core(**core_kw)`` engine whose tokenizer records what it encodes. Longest
    unknown: the tokenizer hides its JSON form, so a long text can be refused only by
    encoding pieces."""
    recording = RecordingTokenizer(Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json")),
                                   hide_form=not longest_known)
    tokenizer = PromptTokenizer(recording)
    srv = EngineServer(served_core(**core_kw), tokenizer, model_name="tiny",
                       sleep_modeled_time=False, embedder=SimEmbedder(8, seed_of("tiny")))
    await srv.engine.start()
    transport = httpx.ASGITransport(app=build_app(srv))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://engine",
                                     timeout=60) as http:
            yield Engine(http, recording, tokenizer, srv.max_model_len)
    finally:
        await srv.engine.stop()


@pytest.fixture(params=[True, False], ids=["longest-known", "longest-unknown"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[Engine]:
    async with served(request.param) as live:
        assert live.max_model_len == CONTEXT
        yield live


REFUSALS = [
    ("/v1/completions", {"prompt": HUGE, "max_tokens": 2}, "prompt",
     "This model's maximum context length is 512 tokens. However, you requested at least "),
    ("/v1/completions", {"prompt": ["a short one", HUGE], "max_tokens": 2}, "prompt",
     "(prompt 1 of the batch)"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": HUGE}]}, "messages",
     "However, you requested at least "),
    ("/v1/responses", {"input": HUGE}, "input", "However, you requested at least "),
    ("/generate", {"text": HUGE}, "text", "The input (at least "),
    ("/generate", {"text": ["a short one", HUGE]}, "text", "The input (at least "),
    ("/v1/embeddings", {"input": ["a short one", HUGE]}, "input",
     "However, you requested at least "),
]


@pytest.mark.parametrize(("path", "body", "param", "words"), REFUSALS,
                         ids=[f"{r[0]}-{r[2]}-{i}" for i, r in enumerate(REFUSALS)])
async def test_a_prompt_of_mibs_is_refused_reading_a_bounded_part_of_it(
        engine: Engine, path: str, body: dict[str, Any], param: str, words: str) -> None:
    r = await engine.post(path, body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param, r.text
    assert words in error["message"]
    at_least = int(error["message"].split("at least ")[1].split(" ")[0])
    assert at_least > CONTEXT
    assert sum(engine.recording.given) <= READ_BOUND, engine.recording.given


@pytest.mark.parametrize("text", ["ab\n" * 1_500_000, "中文字符" * 1_100_000],
                         ids=["ascii", "cjk"])
async def test_a_text_without_a_cut_is_refused_unread_where_the_longest_token_is_known(
        text: str) -> None:
    """No space after a non-space, so no piece can be cut from it: a tokenizer whose
    longest token is known still refuses it by its length alone."""
    async with served(True) as live:
        r = await live.post("/v1/completions", {"prompt": text, "max_tokens": 1})
    assert r.status_code == 400, r.text
    assert "However, you requested at least " in r.json()["error"]["message"]
    assert live.recording.given == []


async def test_a_text_without_a_cut_is_encoded_whole_where_the_longest_token_is_unknown(
        ) -> None:
    """The limit of the bound (docs/replicas.md): with no cut to read a piece to and no
    longest token to count by, the text is encoded whole before it is refused."""
    text = "ab\n" * 20_000
    async with served(False) as live:
        r = await live.post("/v1/completions", {"prompt": text, "max_tokens": 1})
    assert r.status_code == 400, r.text
    assert "However, you requested at least " not in r.json()["error"]["message"]
    assert max(live.recording.given) == len(text) > READ_BOUND


async def test_tokenize_counts_a_bounded_number_of_tokens(engine: Engine) -> None:
    r = await engine.post("/tokenize", {"prompt": HUGE})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt"
    # 4 x 512 tokens is fewer than /tokenize's floor: the floor is the bound named
    assert error["message"].endswith(
        "more than the 131072 /tokenize counts (the least it counts for any model; 4 times "
        "this model's maximum context length of 512 tokens is 2048)")
    assert sum(engine.recording.given) <= 2 * (3 * 131_073 + 4096)
    r = await engine.post("/tokenize", {"prompt": "ab " * 3000})  # past the context: counted
    assert r.status_code == 200 and r.json()["count"] == 6000


async def test_tokenize_names_the_contexts_where_they_bound_it() -> None:
    async with served(True, max_model_len=40_000, num_blocks=10_000) as live:
        assert live.max_model_len == 40_000
        r = await live.post("/tokenize", {"prompt": HUGE})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "prompt"
    assert error["message"].endswith(
        "more than the 160000 /tokenize counts (4 times the model's maximum context length "
        "of 40000 tokens)"), error["message"]
    assert sum(live.recording.given) == 0  # refused by its length alone


async def test_a_prompt_exactly_at_the_context_is_served_and_one_past_it_counted_exactly(
        engine: Engine) -> None:
    # 511 tokens of 27 characters: too long to encode whole unread (past 6 bytes a token),
    # too few tokens to be refused; encoded whole, then served with one token of answer
    at_limit = LONG_WORD * (CONTEXT - 1)
    assert len(engine.tokenizer.prompt_ids(engine.tokenizer.encode(at_limit))) == CONTEXT - 1
    for body in ({"prompt": at_limit}, {"prompt": ["a short one", at_limit]}):
        r = await engine.post("/v1/completions", {**body, "max_tokens": 1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] >= CONTEXT - 1
        assert max(engine.recording.given) == len(at_limit)  # encoded whole
    r = await engine.post("/v1/completions", {"prompt": at_limit + LONG_WORD, "max_tokens": 1})
    assert r.status_code == 400
    assert "you requested 513 tokens (512 in the prompt, 1 in the completion)" \
        in r.json()["error"]["message"]


async def test_truncation_reads_the_prompts_end(engine: Engine) -> None:
    last = engine.tokenizer.encode("ab " * 100)[-8:]  # the text repeats: its last 8 tokens
    for path, body in (("/v1/completions", {"prompt": HUGE, "max_tokens": 1,
                                            "return_token_ids": True}),
                       ("/v1/embeddings", {"input": HUGE})):
        r = await engine.post(path, {**body, "truncate_prompt_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 8
        assert sum(engine.recording.given) <= READ_BOUND
        if path == "/v1/completions":
            assert r.json()["choices"][0]["prompt_token_ids"] == \
                engine.tokenizer.prompt_ids(last)[-8:]
