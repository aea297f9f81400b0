"""Whether a call ran on the event loop or off it, the calls of chosen functions counted on
the loop's thread, an engine served around a tokenizer that notes it, and a gateway's
intake of one body counting a function's calls on its loop: for tests that a long piece
of work leaves the loop free."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from types import CodeType, FrameType
from typing import Any, NamedTuple

import httpx

from engine.server import EngineServer, build_app
from gateway.intake import Intake, take_in
from gateway.request_parse import Endpoint
from gateway.state import GatewayState
from tests.support.engine_cores import make_core
from tests.support.posted import posted
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
    ran on a thread with a running event loop (``on_loop``) and the length of its first
    argument (``sizes``: how many ids a ``decode`` decoded; None where it has none), both
    in call order; every other attribute is ``inner``'s."""

    def __init__(self, inner: Any, *names: str) -> None:
        self.inner = inner
        self.on_loop: list[bool] = []
        self.sizes: list[int | None] = []
        self._names = frozenset(names)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self._names:
            return attr

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.on_loop.append(on_event_loop())
            self.sizes.append(len(args[0]) if args and hasattr(args[0], "__len__") else None)
            return attr(*args, **kwargs)

        return noted


class CallsOnLoop:
    """How many times each function a :func:`calls_on_loop` block counts was called on
    the block's thread (the event loop's), by the function (``calls[fn]``)."""

    def __init__(self, counted: Sequence[Callable[..., Any] | CodeType]) -> None:
        self._keys = {fn: _profiled(fn) for fn in counted}
        self._counts = dict.fromkeys(self._keys.values(), 0)

    def __getitem__(self, fn: Callable[..., Any] | CodeType) -> int:
        return self._counts[self._keys[fn]]

    def _profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            key: object = frame.f_code
        elif event == "c_call":
            key = arg
        else:
            return
        if key in self._counts:
            self._counts[key] += 1


def _profiled(fn: Callable[..., Any] | CodeType) -> object:
    """What the profiler names a call of ``fn`` by: a Python function's code object (its
    ``call`` events' frame's), a builtin's self (its ``c_call`` events' argument)."""
    if isinstance(fn, CodeType):
        return fn
    return getattr(fn, "__code__", fn)


@contextlib.contextmanager
def calls_on_loop(*counted: Callable[..., Any] | CodeType) -> Iterator[CallsOnLoop]:
    """Count the calls of each of ``counted`` (a Python function or its code, or a builtin
    such as ``orjson.dumps``) made on this thread (run it on the event loop's) while the
    block runs: ``sys.setprofile`` sees this thread's calls only, not a worker thread's."""
    calls = CallsOnLoop(counted)
    sys.setprofile(calls._profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


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
    async def take() -> TakenIn:
        with calls_on_loop(counted) as calls:
            intake = await take_in(posted(body, path), state, endpoint)
        return TakenIn(calls[counted], intake)

    return asyncio.run(take())
