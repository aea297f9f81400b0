"""A completion's ``echo`` of a prompt given as token ids decodes those ids to the text it
starts with: a long prompt (by n choices, each decoding its own) is decoded in a worker
thread, not on the event loop every stream and the engine's steps share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.loop_check import on_event_loop

LONG = 3000  # prompt tokens: past what is decoded on the loop


class NotingDecodes:
    """A tokenizer noting, for each ``decode`` call, how many ids it decoded and whether
    on the event loop's thread; every other attribute is ``inner``'s."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.decodes: list[tuple[int, bool]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decode(self, ids: Sequence[int], **kw: Any) -> str:
        self.decodes.append((len(ids), on_event_loop()))
        return str(self.inner.decode(ids, **kw))


async def test_an_echoed_long_prompt_of_token_ids_is_decoded_off_the_loop() -> None:
    tok = NotingDecodes(load_tokenizer(None))
    server = EngineServer(make_core(num_blocks=2048, vocab=(259, 4096), max_model_len=4096),
                          tok, model_name="tiny", sleep_modeled_time=False)
    prompt = (tok.inner.encode("hello world, ") * LONG)[:LONG]
    text = tok.inner.decode(prompt, skip_special_tokens=False)
    body = {"model": "tiny", "prompt": prompt, "echo": True, "max_tokens": 1, "n": 2}
    app = build_app(server)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
            r = await http.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            assert [c["text"][:len(text)] for c in r.json()["choices"]] == [text, text]
            r = await http.post("/v1/completions", json={**body, "stream": True})
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
            assert r.text.count(text) == 2  # each choice's first chunk echoes it
    long = [on_loop for n, on_loop in tok.decodes if n >= LONG]
    assert len(long) == 4 and not any(long), tok.decodes
