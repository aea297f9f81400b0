"""A whole answer's text is its deltas joined once (``Generation.read``), by every route:
not an attribute grown by ``+=`` at each delta, which CPython copies whole every time (a
128k-token answer: seconds of the event loop). The deltas are noted as they leave the
generation's real text stream; a concatenation onto the answer so far is counted."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from engine.generate_params import parse_generate
from engine.native_generate import _NativeGeneration
from engine.native_schema import answer_limit, parse_native
from engine.openai_answer import OpenAIGeneration
from engine.server import EngineServer
from engine.text_stream import TextStream
from tests.support.engine_servers import running_engine

MODEL = "tiny-sim"
TOKENS = 400


class _Delta(str):
    """A text delta counting each time text already gathered is concatenated with it."""

    appended = 0

    def __radd__(self, before: str) -> str:
        _Delta.appended += 1
        return str.__add__(before, self)


class _NotingText:
    """``inner`` (a generation's TextStream), its released text as :class:`_Delta`s
    (kept, in order, in ``released``); every other attribute is ``inner``'s."""

    def __init__(self, inner: TextStream) -> None:
        self.inner = inner
        self.released: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def push(self, ids: Sequence[int]) -> str:
        return self._noted(self.inner.push(ids))

    def flush(self) -> str:
        return self._noted(self.inner.flush())

    def _noted(self, text: str) -> str:
        self.released.append(text)
        return _Delta(text)


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    async with running_engine(MODEL, max_model_len=1024) as srv:
        yield srv


async def test_a_native_answer_is_its_deltas_joined_once(server: EngineServer) -> None:
    req = parse_native({"text": "count on", "sampling_params": {
        "max_new_tokens": TOKENS, "ignore_eos": True}},
        model_name=MODEL, vocab_size=server.vocab_size)
    item = req.items[0]
    ids = (await server.each_prompt_ids([item.params], field="text"))[0]
    limit = answer_limit(item, len(ids), max_model_len=server.max_model_len,
                         max_request_tokens=server.max_request_tokens)
    gen = _NativeGeneration(server, item, None, len(ids), limit,
                            await server.submit(item.rid, ids, item.params, limit),
                            time.monotonic())
    noted = _NotingText(gen.text)
    gen.text = noted  # type: ignore[assignment]
    _Delta.appended = 0
    assert await gen.run_out() == "length"
    assert len(noted.released) > TOKENS // 2  # many deltas
    assert gen.answer == "".join(noted.released) and gen.num_output == TOKENS
    assert gen.body("length")["text"] == gen.answer
    assert _Delta.appended == 0


async def test_an_openai_choice_is_its_deltas_joined_once(server: EngineServer) -> None:
    p = parse_generate({"model": MODEL, "prompt": "count on", "max_tokens": TOKENS,
                        "ignore_eos": True}, chat=False, model_name=MODEL,
                       vocab_size=server.vocab_size)
    ids = await server.prompt_ids(p)
    gen = OpenAIGeneration(server, "cmpl-1", 0, False, p, len(ids),
                           await server.submit("cmpl-1", ids, p, TOKENS), prompt_ids=ids)
    noted = _NotingText(gen.text)
    gen.text = noted  # type: ignore[assignment]
    _Delta.appended = 0
    text, reason = await gen.read()
    assert reason == "length" and gen.num_output == TOKENS
    assert len(noted.released) > TOKENS // 2
    assert text == "".join(noted.released)
    assert _Delta.appended == 0
