"""A long token list on ``/detokenize`` (and a long prompt's ``token_strs`` on
``/tokenize``) is read in a worker thread: the event loop stays free meanwhile; a short
one is read on the loop."""

from __future__ import annotations

import httpx

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.loop_check import LoopNoting


async def test_long_token_lists_are_read_off_the_event_loop() -> None:
    tok = LoopNoting(load_tokenizer(None), "decode", "token_strs")
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
