"""A long token list on ``/detokenize`` (and a long prompt's ``token_strs`` on
``/tokenize``) is read in a worker thread: the event loop stays free meanwhile; a short
one is read on the loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from engine.server import EngineServer, build_app
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.loop_check import on_event_loop


class WhereTokenizer:
    """``inner``, noting for each decode and token_strs call whether it ran on a thread
    with a running event loop."""

    def __init__(self, inner: PromptTokenizer) -> None:
        self.inner = inner
        self.on_loop: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _note(self) -> None:
        self.on_loop.append(on_event_loop())

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self._note()
        return self.inner.decode(ids, skip_special_tokens)

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        self._note()
        return self.inner.token_strs(ids)


async def test_long_token_lists_are_read_off_the_event_loop() -> None:
    tok = WhereTokenizer(load_tokenizer(None))
    server = EngineServer(make_core(vocab=(259, 4096)), tok, model_name="tiny",
                          sleep_modeled_time=True)
    transport = httpx.ASGITransport(app=build_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        ids = tok.inner.encode("hello world, ") * 2000
        short, long = ids[:10], ids
        for tokens in (short, long):
            r = await http.post("/detokenize", json={"tokens": tokens})
            assert r.status_code == 200 and r.json()["prompt"] == tok.inner.decode(tokens)
        r = await http.post("/detokenize", json={"tokens": [*long, 10**6]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
        r = await http.post("/tokenize", json={"prompt": "hello world, " * 2000,
                                               "return_token_strs": True})
        assert r.status_code == 200 and len(r.json()["token_strs"]) == r.json()["count"]
    assert tok.on_loop[0] is True and len(tok.on_loop) > 2 and not any(tok.on_loop[1:])
