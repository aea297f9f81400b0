"""A completion's ``echo`` of a prompt given as token ids decodes those ids to the text it
starts with: a long prompt (by n choices, each decoding its own) is decoded in a worker
thread, not on the event loop every stream and the engine's steps share."""

from __future__ import annotations

import httpx

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.loop_check import LoopNoting

LONG = 3000  # prompt tokens: past what is decoded on the loop


async def test_an_echoed_long_prompt_of_token_ids_is_decoded_off_the_loop() -> None:
    tok = LoopNoting(load_tokenizer(None), "decode")
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
    decodes = list(zip(tok.sizes, tok.on_loop, strict=True))
    long = [on_loop for n, on_loop in decodes if n is not None and n >= LONG]
    assert len(long) == 4 and not any(long), decodes
