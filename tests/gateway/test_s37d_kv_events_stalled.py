"""A replica's KV event stream goes silent (its publisher's socket open, no message) while
the ``kv_events`` policy keeps sending it prompts that store blocks: once their stores are
overdue the replica is judged stalled (unmatched in ``choose`` and ``explain``, named in
``policy_state``, ``kvgate_kv_events_stalled`` 1, a warning naming its endpoint), and its
next message clears it. A replica sent only what it holds is never judged stalled."""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import zmq

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_event_subscriber import KVEventSubscriber
from gateway.metrics import GatewayMetrics
from kvwire.kv_event_format import BlockStored, KVEventBatch, encode_payload
from policies.base import Finished, Policy, ReplicaView, Routed, RouteRequest
from policies.kv_index import KVIndex
from policies.registry import build_policy
from tests.support.metrics import samples
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async

BLOCKS = 8
VIEWS = [ReplicaView("r0"), ReplicaView("r1")]


def doc(seed: int) -> list[int]:
    """A prompt of ``BLOCKS`` whole blocks and one token more."""
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(16 * BLOCKS + 1)]


def stored(seq: int, tokens: list[int], first_hash: int) -> list[bytes]:
    ev = BlockStored(tuple(range(first_hash, first_hash + BLOCKS)), None,
                     tuple(tokens[: 16 * BLOCKS]), 16)
    return [b"", seq.to_bytes(8, "big"), encode_payload(KVEventBatch(0.0, (ev,), 0))]


def request(tokens: list[int], at: float) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), arrival_s=at)


@dataclass
class Stream:
    policy: Policy
    index: KVIndex
    sub: KVEventSubscriber
    metrics: GatewayMetrics
    endpoint: str
    publish: Callable[[list[int], int], None]  # tokens stored on r0, their first hash
    clock: list[float]

    def answered(self, tokens: list[int], sent: float) -> None:
        """``tokens`` sent to r0 at ``sent``, its first token 0.5 s later, its answer
        whole 1 s after the send (the clock's now then)."""
        req = request(tokens, sent)
        self.policy.observe(Routed(req, "r0"))
        self.clock[0] = sent + 1.0
        self.policy.observe(Finished(req, "r0", ok=True, ttft_s=0.5, duration_s=1.0))

    def explained(self, tokens: list[int]) -> dict[str, int]:
        d = self.policy.explain(request(tokens, self.clock[0]), VIEWS)
        return {s.replica: s.matched_tokens for s in d.scores}

    async def stalled_gauge(self) -> float:
        page = samples((await self.metrics.page()).decode())
        return page[("kvgate_kv_events_stalled", (("replica", "r0"),))]


@asynccontextmanager
async def stream() -> AsyncIterator[Stream]:
    """r0 publishing on a real ZMQ socket, followed by a subscriber feeding a
    ``kv_events`` policy's index, whose clock the test drives; r1 publishes nothing."""
    ctx = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1", kv_events=endpoint),
                   ReplicaConfig("r1", "http://127.0.0.1:2")])
    policy = build_policy({"name": "kv_events"})
    sub = KVEventSubscriber.for_policy(fleet, policy)
    assert sub is not None and policy.kv_index is not None
    index = policy.kv_index
    assert index.stall_s == 10.0  # twice the policy's grace for a prefill
    clock = [1000.0]
    index.clock = lambda: clock[0]
    metrics = GatewayMetrics(fleet)
    metrics.watch_kv_events(sub)
    seq = itertools.count()

    def publish(tokens: list[int], first_hash: int) -> None:
        pub.send_multipart(stored(next(seq), tokens, first_hash))

    await sub.start()
    try:
        yield Stream(policy, index, sub, metrics, endpoint, publish, clock)
    finally:
        await sub.stop()
        pub.close()
        ctx.term()


async def test_a_silent_stream_is_judged_stalled_and_a_message_clears_it(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kvgate.kv_events")
    held, fresh = doc(1), doc(2)
    async with stream() as s:
        # r0 cached ``held`` (a SUB misses what precedes its joining: sent again)
        await wait_until_async(lambda: s.index.num_blocks("r0") == BLOCKS, 10,
                               "r0's blocks indexed", retry=lambda: s.publish(held, 1))
        assert s.explained(held) == {"r0": 16 * BLOCKS, "r1": 0}
        # the stream goes silent (held back on the way); a new document answered by r0
        # stored blocks there, its first token at 1000.5 + 0.5
        s.answered(fresh, sent=1000.5)
        s.clock[0] = 1011.0  # 10 s after that prefill: not yet
        assert s.index.stalled() == {} and await s.stalled_gauge() == 0.0
        assert s.explained(held)["r0"] == 16 * BLOCKS
        s.clock[0] = 1011.5  # past: evictions since are not in the index
        assert s.explained(held) == {"r0": 0, "r1": 0}
        decision = s.policy.choose(request(held, 1011.5), VIEWS)
        assert decision.reason == "balance" and decision.matched_tokens == 0
        assert s.policy.describe()["kv_events_stalled"] == {
            "r0": {"silent_s": 11.5, "answers": 1}}
        assert await s.stalled_gauge() == 1.0
        s.sub.warn_stalled()
        s.sub.warn_stalled()  # once a minute at most
        warned = [r.getMessage() for r in caplog.records
                  if r.levelno == logging.WARNING and "stalled" in r.getMessage()]
        assert warned == [f"replica r0: no KV event message from {s.endpoint} for 11.5 s, "
                          "though prompts answered there since (1) stored blocks, which the "
                          "engine publishes within a step: its stream is stalled (held back "
                          "on the way, or its publisher stopped), and what the index holds "
                          "of it is not trusted until a message comes"]
        # the stream speaks again: the held-back stores arrive
        s.clock[0] = 1012.0
        before = s.sub.messages
        s.publish(fresh, 100)
        await wait_until_async(lambda: s.sub.messages > before, 10, "r0's message applied")
        assert s.index.stalled() == {} and await s.stalled_gauge() == 0.0
        assert s.policy.describe()["kv_events_stalled"] == {}
        assert s.explained(held)["r0"] == 16 * BLOCKS
        assert s.explained(fresh)["r0"] == 16 * BLOCKS
        s.sub.warn_stalled()
        assert any(r.getMessage() == "replica r0: KV event messages arrive again; its "
                   "index is read again" for r in caplog.records)
        s.index.check_integrity()


async def test_a_replica_sent_only_what_it_holds_is_not_judged_stalled() -> None:
    held = doc(3)
    async with stream() as s:
        await wait_until_async(lambda: s.index.num_blocks("r0") == BLOCKS, 10,
                               "r0's blocks indexed", retry=lambda: s.publish(held, 1))
        # silent from here on; what r0 holds is sent there, again and again: it stores
        # nothing new, so its silence says nothing
        for sent in (1001.0, 1020.0, 1040.0):
            s.answered(held, sent)
        s.clock[0] = 2000.0
        assert s.index.stalled() == {} and await s.stalled_gauge() == 0.0
        assert s.policy.describe()["kv_events_stalled"] == {}
        assert s.explained(held)["r0"] == 16 * BLOCKS
        s.index.check_integrity()
