"""Whether a call ran on the event loop or off it, and an engine served around a tokenizer
that notes it: for tests that a long piece of work leaves the loop free."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx

from engine.server import EngineServer, build_app
from tests.support.engine_cores import make_core
from tests.support.servers import ThreadServer


def on_event_loop() -> bool:
    """Whether the caller runs on a thread with a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class LoopNoting:
    """``inner`` (a tokenizer), noting for each call of its methods ``names`` whether it
    ran on a thread with a running event loop (``on_loop``, in call order); every other
    attribute is ``inner``'s."""

    def __init__(self, inner: Any, *names: str) -> None:
        self.inner = inner
        self.on_loop: list[bool] = []
        self._names = frozenset(names)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self._names:
            return attr

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.on_loop.append(on_event_loop())
            return attr(*args, **kwargs)

        return noted


@contextlib.contextmanager
def served_engine(tokenizer: Any, model: str, embedder: Any = None, **core: Any
                  ) -> Iterator[httpx.Client]:
    """An engine server (sim core of ``make_core(**core)``) using ``tokenizer`` (and
    ``embedder``, when given), on a thread of its own; a client of it."""
    server = ThreadServer(build_app(EngineServer(make_core(**core), tokenizer,
                                                 model_name=model, sleep_modeled_time=False,
                                                 embedder=embedder))).start()
    http = httpx.Client(base_url=server.url, timeout=30)
    try:
        yield http
    finally:
        http.close()
        server.stop()
