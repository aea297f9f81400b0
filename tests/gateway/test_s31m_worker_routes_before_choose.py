"""A worker's decision knows the routes the box's other workers told while its prompt was
tokenized on the pool: the router reads them (``Router.before_choose``, the worker's
``WorkerRoutes.catch_up``) just before its policy chooses. Read only before the prompt was
tokenized, a route told during a long prompt's encoding was missed by that decision."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import orjson
import pytest

from gateway import worker_routes
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.request_parse import parse_body
from gateway.routing import INLINE_CHAT_BYTES, Router
from gateway.worker_routes import WorkerRoutes, route_pair
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from policies.cost import Cost


class _HeldRendering:
    """The project's tokenizer, whose chat rendering (on the pool's thread) waits for
    ``release`` while ``held``."""

    def __init__(self, inner: PromptTokenizer) -> None:
        self.inner = inner
        self.held = False
        self.rendering = threading.Event()
        self.release = threading.Event()

    def render_chat(self, *args: Any, **kwargs: Any) -> str:
        if self.held:
            self.rendering.set()
            assert self.release.wait(10), "never released"
        return self.inner.render_chat(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _long_chat() -> bytes:
    text = " ".join(f"clause{i % 97} of the agreement" for i in range(20_000))
    body = orjson.dumps({"model": "m", "messages": [
        {"role": "system", "content": "You answer questions about contracts."},
        {"role": "user", "content": text}]})
    assert len(body) > INLINE_CHAT_BYTES  # rendered and hashed on the tokenizer pool
    return body


def test_a_route_told_while_the_prompt_is_tokenized_reaches_the_decision(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # no idle read of the inbox in this test: only the router's reads take routes
    monkeypatch.setattr(worker_routes, "DRAIN_S", 3600.0)
    fleet = Fleet([ReplicaConfig(id=f"r{i}", url=f"http://127.0.0.1:{9000 + i}",
                                 kv_capacity_tokens=40_000) for i in range(4)])
    tokenizer = _HeldRendering(load_tokenizer())

    async def run() -> None:
        (inbox_a, to_a), (inbox_b, to_b) = route_pair(), route_pair()
        router = Router(Cost(), cast(PromptTokenizer, tokenizer), fleet, 1)
        a = WorkerRoutes(inbox_a, [to_b], Cost())
        b = WorkerRoutes(inbox_b, [to_a], router.policy)
        router.before_choose = b.catch_up  # as a worker of ``serve --workers N`` sets it
        parsed = parse_body(_long_chat(), "chat")
        request = router.build(parsed)  # the request b's router will decide
        a.start()
        b.start()
        try:
            tokenizer.held = True
            b.catch_up()  # what the worker read before it decided: nothing yet
            deciding = asyncio.create_task(router.decide(parsed, explain=True))
            await asyncio.to_thread(tokenizer.rendering.wait, 10)
            a.routed(request, "r1")  # meanwhile, worker a sends the same prompt to r1
            a.send_waiting()  # what FLUSH_S does
            tokenizer.release.set()
            routing = await deciding
            assert routing.pooled
            held = {s.replica: s.matched_tokens for s in routing.decision.scores
                    if s.matched_tokens}
            assert list(held) == ["r1"], held
            assert routing.decision.chosen == "r1"
            assert (a.sent, b.received) == (1, 1)
        finally:
            tokenizer.release.set()
            a.stop()
            b.stop()
            router.close()

    asyncio.run(run())
