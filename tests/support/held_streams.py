"""A streamed completion held at its replica: the request routed and sent, its first byte
not yet back, for as long as a test looks at what the gateway counts meanwhile."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import openai

from tests.support.fake_replica import Behaviour


@contextlib.contextmanager
def held_stream(behaviour: Behaviour, gateway_url: str) -> Iterator[list[str]]:
    """Stream a completion through ``gateway_url`` while ``behaviour`` (the replica's)
    holds its first byte; yields the list its chunks' texts arrive in, which stays empty
    until the block ends and the replica answers."""
    behaviour.hold = threading.Event()
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0)
    chunks: list[str] = []

    def stream() -> None:
        for chunk in client.completions.create(model="sim-model", prompt="a long prompt " * 200,
                                               max_tokens=2, stream=True):
            chunks.append(chunk.choices[0].text)

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        yield chunks
    finally:
        behaviour.hold.set()
        thread.join(30)
