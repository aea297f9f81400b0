"""A long ``/detokenize`` is decoded and written out in one worker thread, not one thread
for decoding and another for the JSON; a long ``/tokenize`` spells its tokens and writes
them out in one too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core


class CountingPool(ThreadPoolExecutor):
    """The loop's default executor (``asyncio.to_thread``'s), counting the calls given."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.calls = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        return super().submit(fn, *args, **kwargs)


async def test_a_long_detokenize_or_tokenize_takes_one_hop_for_its_answer() -> None:
    tokenizer = load_tokenizer(None)
    server = EngineServer(make_core(), tokenizer, model_name="tiny", sleep_modeled_time=False)
    app = build_app(server)
    pool = CountingPool()
    asyncio.get_running_loop().set_default_executor(pool)
    text = "kv cache " * 500
    ids = tokenizer.encode_many([text])[0]
    assert len(ids) > 2000

    async def post(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The answer to ``body``, with the calls it gave worker threads."""
        pool.calls = 0
        r = await http.post(path, json=body)
        assert r.status_code == 200, r.text
        return pool.calls, r.json()

    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://engine") as http:
        # the body, of thousands of items, is decoded and checked in a thread; the answer
        # is decoded and written out in one more
        hops, answer = await post("/detokenize", {"tokens": ids})
        assert answer == {"prompt": text}
        assert hops == 2
        # the prompt, thousands of characters long, is encoded in a thread; the answer is
        # spelt and written out in one more
        hops, answer = await post("/tokenize", {"prompt": text, "return_token_strs": True})
        assert answer["count"] == len(answer["token_strs"]) == len(answer["tokens"]) > 2000
        assert hops == 2
        hops, answer = await post("/detokenize", {"tokens": ids[:10]})  # all on the loop
        assert answer == {"prompt": tokenizer.decode(ids[:10])} and hops == 0
