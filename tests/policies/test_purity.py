"""The contract of ``policies.base``: ``choose`` does not change a policy's routing state
(``/admin/explain`` calls it without routing anything); only ``observe`` does."""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies.base import Finished, Policy, ReplicaReset, ReplicaView, Routed, RouteRequest
from policies.prompt_chunks import IDS_PER_CHUNK, id_chunks
from policies.registry import POLICY_NAMES, build_policy, load_preset
from tests.support.policy_state import snapshot

# Policies whose ``choose`` keeps caches and the replica facts it is shown (epoch, KV
# capacity, slot gauges): for them the check is on decisions, not on their whole state.
RECORDS_FACTS_IN_CHOOSE = {"cost"}


def doc(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def request(tokens: list[int], policy: Policy, at: float, **kw: Any) -> RouteRequest:
    """The request as the gateway builds it from token ids for ``policy``: the leading
    tokens it asks for, and the chunk hashes when it asks for them."""
    needed = policy.tokens_needed
    chunked = policy.chunk_chars > 0
    return RouteRequest(tokens if needed is None else tokens[:needed], len(tokens),
                        arrival_s=at, chunks=id_chunks(tokens) if chunked else (),
                        chunk_tokens=float(IDS_PER_CHUNK) if chunked else 0.0,
                        fingerprint=hash(tuple(tokens)), **kw)


def fleet(epoch_of_r1: int = 0) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", queued_tokens=300 * i, running=i, kv_usage=0.1 * i,
                        kv_capacity_tokens=50_000 + 10_000 * i,
                        epoch=epoch_of_r1 if i == 1 else 0,
                        prefill_tokens_per_s=20_000.0, healthy=i != 3) for i in range(5)]


def warmed(name: str) -> Policy:
    """``name`` with its preset, after a stream of routed and finished requests."""
    policy = build_policy(load_preset(name))
    docs = [doc(s, 1200) for s in range(6)]
    for i in range(60):
        tokens = [*docs[i % 3 if i % 4 else i % 6], *doc(100 + i, 40)]
        req = request(tokens, policy, at=i * 0.1)
        views = fleet()
        chosen = policy.choose(req, views).chosen
        policy.observe(Routed(req, chosen, views))
        policy.observe(Finished(req, chosen, True, 600, 0.05, 0.2))
    policy.observe(ReplicaReset("r2"))
    return policy


def probes(policy: Policy) -> list[tuple[RouteRequest, list[ReplicaView]]]:
    """Requests seen before, new ones, and a fleet in which a replica restarted."""
    seen = [*doc(0, 1200), *doc(7, 40)]
    new = [*doc(50, 1500), *doc(8, 40)]
    return [(request(seen, policy, at=7.0), fleet()),
            (request(new, policy, at=7.1, affinity_key="k"), fleet()),
            (request(seen, policy, at=7.2), fleet(epoch_of_r1=1))]


@pytest.mark.parametrize("name", sorted(set(POLICY_NAMES) - RECORDS_FACTS_IN_CHOOSE))
def test_choose_is_pure(name: str) -> None:
    policy = warmed(name)
    before = snapshot(policy)
    for req, views in probes(policy):
        policy.choose(req, views)
        assert snapshot(policy) == before, f"{name}.choose changed the policy's state"
    assert policy.describe() == warmed(name).describe()


@pytest.mark.parametrize("name", sorted(POLICY_NAMES))
def test_choose_does_not_change_later_decisions(name: str) -> None:
    """Choosing (as ``/admin/explain`` does) leaves every later decision as it would have
    been: two copies, one asked first, decide alike afterwards."""
    asked, untouched = warmed(name), warmed(name)
    cases = probes(asked)
    for req, views in cases:
        asked.choose(req, views)
    for policy in (asked, untouched):
        for value in vars(policy).values():  # tie breaks drawn alike from here on
            if isinstance(value, random.Random):
                value.seed(1)
    for req, views in cases:
        first = asked.choose(req, views)
        assert asked.choose(req, views).ranked[0] == first.ranked[0]
        assert first == untouched.choose(req, views)
