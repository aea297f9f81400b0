"""A request no replica answered (every try timed out) is over for the policy: its tries,
which may have reached their replica, stand, and none stays pending. A route another
worker process tells stands at once."""

from __future__ import annotations

import asyncio
import random
import threading

import httpx

from gateway.worker_routes import WorkerRoutes, route_pair
from policies.base import ReplicaView, RouteRequest
from policies.cost import Cost
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway


def _prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(400))


def test_a_request_no_replica_answered_leaves_no_try_pending(serve: Serve) -> None:
    held = threading.Event()
    slow = Behaviour("slow", hold=held)
    gw = start_gateway(serve, [("slow", serve(fake_replica(slow)).url)],
                       policy={"name": "cost"}, timeouts={"first_byte_s": 0.5})
    try:
        prompt = _prompt(1)
        r = httpx.post(f"{gw.url}/v1/completions", timeout=10,
                       json={"model": "sim-model", "prompt": prompt})
        assert r.status_code == 504, r.text
        assert len(slow.received) == 1
        shown = httpx.post(f"{gw.admin}/admin/explain", headers=AUTH, timeout=10,
                           json={"model": "sim-model", "prompt": prompt}).json()
        state = shown["policy_state"]
        assert state["pending_tries"] == 0, state  # the bug: pending for good
        # the timed-out try may have reached the replica: it stands
        assert state["model_tokens"]["slow"] > 300, state
    finally:
        held.set()


def test_a_route_another_worker_tells_is_not_pending() -> None:
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=40_000) for i in range(2)]
    rng = random.Random(2)
    doc = RouteRequest(tokens=(), prompt_tokens=64 * 16, model="m", arrival_s=0.0,
                       chunks=[rng.randrange(1 << 32) for _ in range(64)], chunk_tokens=16.0)

    async def run() -> None:
        (inbox_a, to_a), (inbox_b, to_b) = route_pair(), route_pair()
        a, b = WorkerRoutes(inbox_a, [to_b], Cost()), WorkerRoutes(inbox_b, [to_a], Cost())
        a.start()
        b.start()
        try:
            a.routed(doc, "r1")
            for _ in range(200):
                if b.received:
                    break
                await asyncio.sleep(0.01)
            assert b.received == 1
            policy = b.policy
            assert isinstance(policy, Cost)
            assert policy.describe()["pending_tries"] == 0  # the bug: 1, for good
            held = {s.replica: s.matched_tokens for s in policy.choose(doc, fleet).scores}
            assert held["r1"] >= 60 * 16
        finally:
            a.stop()
            b.stop()

    asyncio.run(run())
