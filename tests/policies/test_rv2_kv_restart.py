"""One engine restart told twice, by its KV event stream (its sequence numbers went back)
and by a scrape (its counters went back): the index is cleared once, and keeps what the new
process's stream told it since."""

from __future__ import annotations

import pytest

from kvwire.kv_event_format import BlockStored
from policies.base import ReplicaReset
from policies.per_model import PerModel
from policies.registry import build_policy

OLD = tuple(range(100, 164))  # 4 blocks of 16
NEW = tuple(range(500, 564))


def stored(first_hash: int, tokens: tuple[int, ...]) -> list[BlockStored]:
    n = len(tokens) // 16
    return [BlockStored(tuple(range(first_hash, first_hash + n)), None, tokens, 16)]


@pytest.mark.parametrize("name", ["kv_events", "cost"])
@pytest.mark.parametrize("models", [1, 3])
def test_a_scrape_reset_after_the_stream_showed_the_restart_keeps_the_new_blocks(
        name: str, models: int) -> None:
    policy = PerModel(build_policy({"name": name}), lambda: build_policy({"name": name}))
    for model in ("a", "b", "c")[:models]:
        policy.policy_for(model)  # each model's policy resets the one index they share
    index = policy.kv_index
    assert index is not None
    index.apply("r0", 5000, stored(1, OLD))
    index.apply("r0", 0, stored(10, NEW))  # numbered from 0 again: it restarted
    assert index.match(OLD, ["r0"]) == {"r0": 0}
    assert index.match(NEW, ["r0"]) == {"r0": 4}
    index.apply("r0", 1, stored(20, OLD))  # learned since: the new process caches OLD
    policy.observe(ReplicaReset("r0"))  # the next scrape sees the same restart
    assert index.match(NEW, ["r0"]) == {"r0": 4}
    assert index.match(OLD, ["r0"]) == {"r0": 4}
    assert index.stats.restarts == 1 and index.resets["r0"] == 1
    assert index.last_seq("r0") == 1
    index.check_integrity()
    # a later restart that only a scrape tells clears it, once
    index.apply("r0", 2, [])
    policy.observe(ReplicaReset("r0"))
    assert index.num_blocks("r0") == 0 and index.last_seq("r0") is None
    assert index.stats.restarts == 2 and index.resets["r0"] == 2
    index.check_integrity()


def test_a_scrape_reset_first_then_the_new_stream_clears_once() -> None:
    policy = build_policy({"name": "kv_events"})
    index = policy.kv_index
    assert index is not None
    index.apply("r0", 5000, stored(1, OLD))
    policy.observe(ReplicaReset("r0"))  # the scrape saw it first
    index.apply("r0", 0, stored(10, NEW))  # no number to go back from: starts afresh
    assert index.match(NEW, ["r0"]) == {"r0": 4} and index.num_blocks("r0") == 4
    assert index.stats.restarts == 1
    # nothing was left pending: the next restart a scrape tells clears the replica
    index.apply("r0", 1, [])
    policy.observe(ReplicaReset("r0"))
    assert index.num_blocks("r0") == 0 and index.stats.restarts == 2
