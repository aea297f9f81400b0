"""A tiny sim engine's OpenAI server on a loopback port, with an httpx and an openai client
pointed at it, or running on the test's own event loop, its app called in-process (see
``engine_cores`` for the engine itself)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import httpx
import openai

from engine.core import EngineCore
from engine.executor import Executor
from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.servers import ThreadServer


class LiveEngine:
    """A served engine: ``url``, its ``server`` object, and ``http`` and ``client``."""

    def __init__(self, url: str, server: EngineServer) -> None:
        self.url = url
        self.server = server
        self.http = httpx.Client(base_url=url, timeout=30)
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks of a streamed answer to ``body`` on ``path``, parsed; it must end
        with ``[DONE]``."""
        r = self.http.post(path, json={**body, "stream": True})
        assert r.status_code == 200, r.text
        datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert datas[-1] == "[DONE]", datas[-3:]
        return [json.loads(d) for d in datas[:-1]]


E = TypeVar("E", bound=LiveEngine)


def served_core(executor: Callable[[Executor], Executor] | None = None, **core_kw: Any
                ) -> EngineCore:
    """A ``make_core`` engine of 256 blocks of 4, a 4,096-id vocabulary and 512 tokens of
    context unless ``core_kw`` says otherwise; ``executor``: what the core runs in place
    of its sim executor, given that one."""
    core = make_core(**{"num_blocks": 256, "block_size": 4, "vocab": (259, 4096),
                        "max_model_len": 512, **core_kw})
    if executor is not None:
        core.executor = executor(core.executor)
    return core


def serve_engine(kind: type[E], model: str, server_kw: dict[str, Any] | None = None,
                 executor: Callable[[Executor], Executor] | None = None,
                 **core_kw: Any) -> Iterator[E]:
    """Serve a ``served_core(executor, **core_kw)`` engine as ``model`` until the generator
    closes."""
    srv = EngineServer(served_core(executor, **core_kw), load_tokenizer(None),
                       model_name=model, sleep_modeled_time=True, **(server_kw or {}))
    server = ThreadServer(build_app(srv)).start()
    live = kind(server.url, srv)
    try:
        yield live
    finally:
        live.http.close()
        live.client.close()
        server.stop()


@contextlib.asynccontextmanager
async def running_engine(model: str, executor: Callable[[Executor], Executor] | None = None,
                         **core_kw: Any) -> AsyncIterator[EngineServer]:
    """A ``served_core(executor, **core_kw)`` engine's server as ``model``, its engine running
    on this event loop (modeled time not slept) until the block ends; no port: its app is
    called in-process."""
    srv = EngineServer(served_core(executor, **core_kw), load_tokenizer(None),
                       model_name=model, sleep_modeled_time=False)
    await srv.engine.start()
    try:
        yield srv
    finally:
        await srv.engine.stop()
