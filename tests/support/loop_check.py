"""Whether a call ran on the event loop or off it, an engine served around a tokenizer
that notes it, and a gateway's intake of one body counting a function's calls on its loop:
for tests that a long piece of work leaves the loop free."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from types import CodeType, FrameType
from typing import Any, NamedTuple

import httpx
from starlette.requests import Request

from engine.server import EngineServer, build_app
from gateway.intake import Intake, take_in
from gateway.request_parse import Endpoint
from gateway.state import GatewayState
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


class TakenIn(NamedTuple):
    calls_on_loop: int  # the calls of the code counted, on the event loop's thread
    intake: Intake


def taken_in(state: GatewayState, body: bytes, path: str, endpoint: Endpoint | None,
             counted: CodeType) -> TakenIn:
    """``body`` taken in (``take_in``) as a POST to ``path`` of ``state``'s gateway, on an
    event loop of its own, counting the calls of ``counted`` made on the loop's thread (a
    worker thread's are not)."""
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # no disconnect while the body is read
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(b"content-length", str(len(body)).encode())]}
    calls = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call" and frame.f_code is counted:
            calls += 1

    async def take() -> Intake:
        sys.setprofile(profile)  # this thread's calls only: the loop's, not a worker's
        try:
            return await take_in(Request(scope, receive), state, endpoint)
        finally:
            sys.setprofile(None)

    intake = asyncio.run(take())
    return TakenIn(calls, intake)
