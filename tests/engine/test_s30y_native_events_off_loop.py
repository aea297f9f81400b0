"""SGLang's ``/generate`` resends everything so far in each streamed event (its default):
a late event of a long answer with ``top_logprobs_num`` is large, and is built and
serialised in a worker thread, not on the event loop every stream and the engine's steps
share; a small event (most) on the loop. A whole answer that large too."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
from starlette.responses import JSONResponse

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.loop_check import calls_on_loop

TOKENS = 150  # with 20 alternatives each, an event of them names 3,000+ items


async def test_large_generate_events_are_serialised_off_the_event_loop() -> None:
    server = EngineServer(make_core(num_blocks=256, vocab=(259, 4096)), load_tokenizer(None),
                          model_name="tiny", sleep_modeled_time=False)
    app = build_app(server)
    dumps, render = orjson.dumps, JSONResponse.render
    on_loop = {"dumps": 0, "render": 0}

    async def post(body: dict[str, Any]) -> httpx.Response:
        """The answer to ``body``, with ``on_loop`` counting the events serialised and
        answers written on this (the event loop's) thread meanwhile."""
        with calls_on_loop(dumps, render) as calls:  # not a worker's calls
            r = await http.post("/generate", json=body)
        on_loop.update(dumps=calls[dumps], render=calls[render])
        assert r.status_code == 200, r.text
        return r

    def events(r: httpx.Response) -> list[dict[str, Any]]:
        datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert datas[-1] == "[DONE]"
        return [json.loads(d) for d in datas[:-1]]

    asked = {"text": "the native api", "return_logprob": True, "top_logprobs_num": 20,
             "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0,
                                 "ignore_eos": True}}
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://engine") as http:
        short = events(await post({"text": "hi", "stream": True,
                                   "sampling_params": {"max_new_tokens": 8}}))
        assert len(short) == 8 and on_loop["dumps"] == len(short)  # all on the loop

        long = events(await post({**asked, "stream": True}))
        assert len(long) == TOKENS
        last = long[-1]
        assert len(last["output_ids"]) == TOKENS
        assert len(last["meta_info"]["output_top_logprobs"]) == TOKENS
        assert all(len(top) == 20 for top in last["meta_info"]["output_top_logprobs"])
        assert last["meta_info"]["finish_reason"] is not None
        # the early events on the loop, the late (large) ones off it
        assert 0 < on_loop["dumps"] < len(long)

        whole = (await post(asked)).json()
        assert len(whole["meta_info"]["output_top_logprobs"]) == TOKENS
        assert on_loop["render"] == 0
        small = (await post({"text": "hi", "sampling_params": {"max_new_tokens": 4}})).json()
        assert len(small["output_ids"]) == 4 and on_loop["render"] == 1
