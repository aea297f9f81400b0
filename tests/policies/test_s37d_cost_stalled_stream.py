"""``cost`` over an index whose replica's KV event stream goes silent while prompts answered
there stored blocks: the replica is read from the cache model until a message comes."""

from __future__ import annotations

import random

from kvwire.kv_event_format import BlockStored
from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.kv_index import KVIndex

DOC = 1000  # tokens per document
HELD = (DOC - 1) // 16 * 16  # what a replica holding a document serves of it from cache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def doc(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(DOC)]


def views() -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=20_000) for i in range(3)]


def request(tokens: list[int], at: float) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def store(index: KVIndex, replica: str, tokens: list[int], first_hash: int, seq: int
          ) -> None:
    n = len(tokens) // 16
    index.apply(replica, seq, [BlockStored(tuple(range(first_hash, first_hash + n)), None,
                                           tuple(tokens[: n * 16]), 16)])


def matched(policy: Cost, tokens: list[int], at: float) -> dict[str, int]:
    d = policy.choose(request(tokens, at), views())
    return {s.replica: s.matched_tokens for s in d.scores if s.matched_tokens}


def answered(policy: Cost, clock: Clock, tokens: list[int], sent: float, replica: str
             ) -> None:
    """``tokens`` sent to ``replica`` at ``sent``, its first token 0.5 s later, its answer
    whole 1 s after the send (the clock's now then)."""
    req = request(tokens, sent)
    policy.observe(Routed(req, replica))
    clock.now = sent + 1.0
    policy.observe(Finished(req, replica, ok=True, ttft_s=0.5, duration_s=1.0))


def cost_with_clock() -> tuple[Cost, KVIndex, Clock]:
    policy = Cost()
    index, clock = policy.kv_index, Clock()
    assert index is not None and index.stall_s == 2 * policy.config.kv_event_grace_s == 10
    index.clock = clock
    return policy, index, clock


def test_a_replica_whose_stream_stalled_is_read_from_the_model_until_a_message() -> None:
    policy, index, clock = cost_with_clock()
    elsewhere = doc(1)  # r0 cached it for someone else: the index's word alone
    store(index, "r0", elsewhere, 1, seq=0)  # heard at 0
    assert matched(policy, elsewhere, at=20.0) == {"r0": HELD}
    # a new document answered by r0 at 21-22: its prefill stored blocks, unheard of
    answered(policy, clock, doc(2), sent=21.0, replica="r0")
    index.check_integrity()
    # its first token (the prefill's end) at 21.5: stalled past 31.5
    assert matched(policy, elsewhere, at=31.0) == {"r0": HELD}
    clock.now = 31.0
    assert policy.describe()["kv_events_stalled"] == {}
    clock.now = 32.0
    assert matched(policy, elsewhere, at=32.0) == {}  # the model knows nothing of it there
    assert policy.describe()["kv_events_stalled"] == {"r0": {"silent_s": 32.0, "answers": 1}}
    # a message comes (the stream held back, delivered): read again
    clock.now = 33.0
    store(index, "r0", doc(2), 10_000, seq=1)
    index.check_integrity()
    assert policy.describe()["kv_events_stalled"] == {}
    assert matched(policy, elsewhere, at=33.0) == {"r0": HELD}


def test_no_stall_for_prompts_that_stored_nothing_new_or_were_heard_after_their_send(
        ) -> None:
    policy, index, clock = cost_with_clock()
    held, fresh = doc(3), doc(4)
    store(index, "r0", held, 1, seq=0)  # heard at 0
    # what r0 holds whole is sent there and answered: it stores nothing new
    answered(policy, clock, held, sent=20.0, replica="r0")
    # a new document sent to r1 at 30, a message of r1 heard after (at 30.5): its stream
    # speaks, whatever that message stored
    store(index, "r1", doc(5), 5000, seq=0)  # heard at 21
    req = request(fresh, 30.0)
    policy.observe(Routed(req, "r1"))
    clock.now = 30.5
    store(index, "r1", doc(7), 9000, seq=1)
    clock.now = 31.0
    policy.observe(Finished(req, "r1", ok=True, ttft_s=0.2, duration_s=1.0))
    # a new document that was not answered (no prefill known to have happened)
    req = request(doc(6), 40.0)
    policy.observe(Routed(req, "r0"))
    clock.now = 41.0
    policy.observe(Finished(req, "r0", ok=False))
    clock.now = 500.0
    index.check_integrity()
    assert index.stalled() == {} and policy.describe()["kv_events_stalled"] == {}
    assert matched(policy, held, at=500.0)["r0"] == HELD
