"""A large request body (in bytes, or in items: more than 2,048 commas) is decoded and
checked in a worker thread on every route, so one client's 20 MiB prompt of token ids does
not hold the event loop (every other stream, and the engine loop stepping them); a small
one is checked on the loop. Where the checks ran is seen where they compare the body's
``model`` with the served name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.sim_embedding import SimEmbedder
from kvwire.tokenizer import load_tokenizer
from tests.support.loop_check import on_event_loop, served_engine


class LoopNotingName(str):
    """A served model name noting, each time a body's ``model`` is compared with it,
    whether that ran on a thread with a running event loop."""

    on_loop: list[bool]

    def __ne__(self, other: object) -> bool:
        self.on_loop.append(on_event_loop())
        return str.__ne__(self, other)

    __hash__ = str.__hash__


NAME = LoopNotingName("tiny-sim")
NAME.on_loop = []
LONG_IDS = list(range(300, 300 + 3000))  # 2,999 commas: past the loop's bound


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with served_engine(load_tokenizer(None), NAME, embedder=SimEmbedder(8, 1),
                       num_blocks=256, block_size=4, vocab=(259, 4096),
                       max_model_len=512) as client:
        yield client


def _bodies(ids: list[int]) -> list[tuple[str, dict[str, Any]]]:
    messages = [{"role": "user", "content": [{"type": "text", "text": "w"}] * len(ids)}]
    return [
        ("/v1/completions", {"model": NAME, "prompt": ids, "max_tokens": 1}),
        ("/v1/chat/completions", {"model": NAME, "max_tokens": 1, "messages": messages}),
        ("/v1/responses", {"model": NAME, "max_output_tokens": 1, "input": [
            {"role": "user", "content": "w"}] * len(ids)}),
        ("/generate", {"model": NAME, "input_ids": ids,
                       "sampling_params": {"max_new_tokens": 1}}),
        ("/v1/embeddings", {"model": NAME, "input": ids}),
        ("/tokenize", {"model": NAME, "messages": messages}),
        ("/detokenize", {"model": NAME, "tokens": ids}),
    ]


@pytest.mark.parametrize(("path", "body"), _bodies(LONG_IDS))
def test_a_body_of_many_items_is_checked_off_the_event_loop(
        http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    NAME.on_loop.clear()
    r = http.post(path, json=body)
    # answered (a completion past the context is refused after its checks)
    assert r.status_code in (200, 400), r.text
    assert NAME.on_loop and not any(NAME.on_loop), (path, NAME.on_loop)


@pytest.mark.parametrize(("path", "body"), _bodies([300, 301, 302]))
def test_a_small_body_is_checked_on_the_event_loop(
        http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    NAME.on_loop.clear()
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    assert NAME.on_loop and all(NAME.on_loop), (path, NAME.on_loop)
