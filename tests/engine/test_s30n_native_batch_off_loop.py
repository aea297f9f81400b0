"""A ``/generate`` batch is answered whole: its answers are built, and written out, in one
worker thread when they name many items in all, though each alone names few (50 answers
of 1,999 items each built ~100k items on the event loop, one generation at a time)."""

from __future__ import annotations

from typing import Any

import httpx

from engine.native_logprobs import LogprobFields
from engine.server import EngineServer, build_app
from kvwire.request_edge import INLINE_ANSWER_ITEMS
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.loop_check import calls_on_loop

TOKENS, TOP = 100, 5  # an answer names TOKENS * (2 + TOP) items: 700
BUILD = LogprobFields.fields.__code__  # one call per answer built


async def test_a_batch_of_many_items_in_all_is_built_off_the_event_loop() -> None:
    assert TOKENS * (2 + TOP) < INLINE_ANSWER_ITEMS < 4 * TOKENS * (2 + TOP)
    server = EngineServer(make_core(num_blocks=512, vocab=(259, 4096)),
                          load_tokenizer(None), model_name="tiny", sleep_modeled_time=False)
    app = build_app(server)
    built_on_loop = 0

    async def answers(texts: list[str], tokens: int) -> list[dict[str, Any]]:
        nonlocal built_on_loop
        with calls_on_loop(BUILD) as calls:  # this thread's calls only, not a worker's
            r = await http.post("/generate", json={
                "text": texts, "return_logprob": True, "top_logprobs_num": TOP,
                "sampling_params": {"max_new_tokens": tokens, "temperature": 0,
                                    "ignore_eos": True}})
        built_on_loop = calls[BUILD]
        assert r.status_code == 200, r.text
        got: list[dict[str, Any]] = r.json()
        assert len(got) == len(texts)
        for answer in got:
            assert len(answer["output_ids"]) == tokens
            assert [len(top) for top in answer["meta_info"]["output_top_logprobs"]] \
                == [TOP] * tokens
        return got

    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://engine") as http:
        await answers(["one", "two"], 4)  # few items in all: built on the loop
        assert built_on_loop == 2
        await answers(["one", "two", "three", "four"], TOKENS)
        assert built_on_loop == 0
