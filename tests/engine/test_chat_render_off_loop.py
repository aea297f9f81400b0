"""A long chat is rendered with its template in a worker thread, so the event loop (every
other stream of the replica) is not held while megabytes of messages are written out; a
short one is rendered on the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.server import EngineServer, build_app
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.servers import ThreadServer

MODEL = "tiny-sim"


class WhereRendered:
    """``inner``, noting for each chat rendered whether it ran on the event loop."""

    def __init__(self, inner: PromptTokenizer) -> None:
        self.inner = inner
        self.on_loop: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def render_chat(self, *args: Any, **kwargs: Any) -> str:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.on_loop.append(False)
        else:
            self.on_loop.append(True)
        return str(self.inner.render_chat(*args, **kwargs))


@pytest.fixture
def served() -> Iterator[tuple[httpx.Client, WhereRendered]]:
    tok = WhereRendered(load_tokenizer(None))
    core = make_core(num_blocks=4096, block_size=16, vocab=(259, 4096), max_model_len=60000)
    server = ThreadServer(build_app(EngineServer(core, tok, model_name=MODEL,
                                                 sleep_modeled_time=False))).start()
    http = httpx.Client(base_url=server.url, timeout=30)
    try:
        yield http, tok
    finally:
        http.close()
        server.stop()


@pytest.mark.parametrize(("messages", "on_loop"), [
    ([{"role": "user", "content": "hello"}], True),
    ([{"role": "user", "content": "word " * 2000}], False),
    ([{"role": "user", "content": [{"type": "text", "text": "word " * 2000}]}], False),
])
def test_a_long_chat_is_rendered_off_the_event_loop(
        served: tuple[httpx.Client, WhereRendered], messages: list[Any], on_loop: bool
) -> None:
    http, tok = served
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert tok.on_loop == [on_loop]
