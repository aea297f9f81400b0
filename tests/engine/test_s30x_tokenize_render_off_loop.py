"""``/tokenize`` of a long text (or chat) and ``/detokenize`` of a long list write their
JSON answer (millions of ids, or their text, from a 64 MiB body) in a worker thread, not
on the event loop every stream and the engine's steps share; a short one on the loop."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.responses import JSONResponse

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.loop_check import calls_on_loop

LONG_TEXT = "hello world, " * 2000  # some 6,000 tokens


async def test_long_tokenize_answers_are_written_off_the_event_loop() -> None:
    tok = load_tokenizer(None)
    server = EngineServer(make_core(vocab=(259, 4096)), tok, model_name="tiny",
                          sleep_modeled_time=True)
    transport = httpx.ASGITransport(app=build_app(server))
    render = JSONResponse.render

    async def post(path: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The answer to ``body``, and how many JSON bodies were written on this (the
        event loop's) thread meanwhile."""
        with calls_on_loop(render) as calls:  # this thread's calls only, not a worker's
            r = await http.post(path, json=body)
        assert r.status_code == 200, r.text
        return r.json(), calls[render]

    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        short, on_loop = await post("/tokenize", {"prompt": "hello world"})
        assert short["tokens"] == tok.prompt_ids(tok.encode("hello world")) and on_loop == 1
        long, on_loop = await post("/tokenize", {"prompt": LONG_TEXT})
        assert long["count"] == len(long["tokens"]) > 2000 and on_loop == 0
        chat, on_loop = await post("/tokenize", {"messages": [
            {"role": "user", "content": LONG_TEXT}]})
        assert chat["count"] > 2000 and on_loop == 0
        text, on_loop = await post("/detokenize", {"tokens": long["tokens"]})
        assert LONG_TEXT in text["prompt"] and on_loop == 0
