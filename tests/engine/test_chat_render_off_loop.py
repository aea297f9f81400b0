"""A long chat is rendered with its template in a worker thread, so the event loop (every
other stream of the replica) is not held while megabytes of messages are written out; a
short one is rendered on the loop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kvwire.tokenizer import load_tokenizer
from tests.support.loop_check import LoopNoting, served_engine

MODEL = "tiny-sim"


@pytest.fixture
def served() -> Iterator[tuple[httpx.Client, LoopNoting]]:
    tok = LoopNoting(load_tokenizer(None), "render_chat")
    with served_engine(tok, MODEL, num_blocks=4096, block_size=16, vocab=(259, 4096),
                       max_model_len=60000) as http:
        yield http, tok


@pytest.mark.parametrize(("messages", "on_loop"), [
    ([{"role": "user", "content": "hello"}], True),
    ([{"role": "user", "content": "word " * 2000}], False),
    ([{"role": "user", "content": [{"type": "text", "text": "word " * 2000}]}], False),
])
def test_a_long_chat_is_rendered_off_the_event_loop(
        served: tuple[httpx.Client, LoopNoting], messages: list[Any], on_loop: bool
) -> None:
    http, tok = served
    r = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                "max_tokens": 1})
    assert r.status_code == 200, r.text
    assert tok.on_loop == [on_loop]
