"""A whole-set assignment spread over calls (``begin_assign``, ``advance``): each call places
a bounded number of keys, homes change only when the pass is done, and they are the homes
``assign`` gives at once."""

import copy
import random
from collections.abc import Callable, Iterator

import pytest

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig
from policies.placement import REASSIGN_ON_JOIN, HotPlacement, Overflow
from policies.ring import Ring, stable_hash

REPLICAS = [f"r{i}" for i in range(6)]
HOMES, SCRATCH = REPLICAS[:4], REPLICAS[4:]
RING = Ring([(r, 1.0) for r in REPLICAS], 256)
DOC = 1500  # tokens a hot key's prompt holds


def keys(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [stable_hash(rng.randbytes(8)) for _ in range(n)]


class Walks:
    """Ring order over ``replicas``, counting the walks started."""

    def __init__(self, replicas: list[str]) -> None:
        self.replicas, self.started = replicas, 0

    def __call__(self, key: int) -> Iterator[str]:
        self.started += 1
        return (r for r in RING.walk(key) if r in self.replicas)


def homes_of(placement: HotPlacement, ks: list[int]) -> dict[int, str | None]:
    return {k: placement.home_of(k) for k in ks}


def test_each_call_of_a_pass_walks_for_at_most_its_step_of_keys_and_homes_change_at_once(
        ) -> None:
    for seed in range(6):
        rng = random.Random(seed)
        room = {r: rng.randrange(4, 16) * DOC for r in REPLICAS}
        sizes = {k: rng.randrange(DOC // 2, 2 * DOC) for k in keys(rng.randrange(40, 90), seed)}
        ks = list(sizes)
        walks, overflow_walks = Walks(HOMES), Walks(SCRATCH)
        overflow = Overflow(SCRATCH, overflow_walks)
        gradual, at_once = HotPlacement(step=16), HotPlacement(step=16)
        larger = {r: n * 4 // 3 for r, n in room.items()}
        for placement in (gradual, at_once):  # placed while the rooms were a third larger
            for k in ks:
                placement.place(k, sizes[k], walks, HOMES, larger.__getitem__, overflow)
        before = homes_of(gradual, ks)
        at_once.assign(walks, HOMES, room.__getitem__, overflow)
        walks.started = overflow_walks.started = 0
        gradual.begin_assign(walks, HOMES, room.__getitem__, overflow)
        calls = 1
        while True:
            # a key walks its homes at most three times (room, fair share, least loaded)
            # and the overflow set once: a call's work is bounded by its step
            assert walks.started + overflow_walks.started <= 4 * gradual.step, seed
            walks.started = overflow_walks.started = 0
            gradual.check_integrity()
            if homes_of(gradual, ks) != before:
                break  # swapped in: only by the pass's last call
            assert gradual.advance() or homes_of(gradual, ks) != before, seed
            calls += 1
        assert calls == -(-len(ks) // gradual.step), seed  # every call placed its step
        assert not gradual.advance()
        assert homes_of(gradual, ks) == homes_of(at_once, ks), seed


def test_keys_that_join_or_leave_during_a_pass_keep_what_they_were_given() -> None:
    ks = keys(REASSIGN_ON_JOIN + 8)
    walks = Walks(REPLICAS)
    room: Callable[[str], int] = lambda r: 100 * DOC  # noqa: E731
    gradual = HotPlacement(limit=len(ks), step=64)
    for k in ks:
        gradual.place(k, DOC, walks, REPLICAS[:3], room)  # then three more join
    gradual.check_integrity()
    at_once = copy.deepcopy(gradual)
    at_once.assign(walks, REPLICAS, room)
    gradual.begin_assign(walks, REPLICAS, room)
    joined = keys(4, seed=1)
    given = {}
    for k in joined:  # each evicts the oldest key (the limit), and is placed first fit
        given[k] = gradual.place(k, DOC, walks, REPLICAS, room)
        gradual.check_integrity()
        assert gradual.advance()
    while gradual.advance():
        pass
    gradual.check_integrity()
    left, stayed = ks[:4], ks[4:]
    assert homes_of(gradual, left) == dict.fromkeys(left)
    assert homes_of(gradual, joined) == given
    assert homes_of(gradual, stayed) == homes_of(at_once, stayed)
    assert len(gradual) == len(ks)


def test_a_replica_leaving_during_a_pass_gives_it_up() -> None:
    ks = keys(60)
    walks = Walks(REPLICAS)
    placement = HotPlacement(step=8)
    for k in ks:
        placement.place(k, DOC, walks, REPLICAS, lambda r: 20 * DOC)
    placement.begin_assign(walks, REPLICAS, lambda r: 10 * DOC)
    assert placement.advance()
    placement.forget_replica("r2")
    assert not placement.advance()  # nothing under way: it would home keys on r2
    placement.check_integrity()
    assert "r2" not in homes_of(placement, ks).values()
    assert placement.tokens_on("r2") == 0


def test_a_step_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="step must be >= 1 or None, got 0"):
        HotPlacement(step=0)


def test_the_window_decision_of_cost_leaves_the_homes_to_the_next_decisions() -> None:
    """Cost begins the window's assignment on the request path and finishes it over the
    next decisions: the window's own decision changes no home (a large hot set placed
    all at once there held that request for tens of ms)."""
    policy = Cost(CostConfig(sketch_width=4096))  # windows of 512 decisions at most

    def fleet(n: int) -> list[ReplicaView]:
        return [ReplicaView(f"r{i}", kv_capacity_tokens=10**6) for i in range(n)]

    def prompt(seed: int) -> RouteRequest:
        rng = random.Random(seed)
        return RouteRequest(tokens=[rng.randrange(50_000) for _ in range(200)],
                            prompt_tokens=200, model="m", arrival_s=float(policy._routed))

    def route(seed: int, n: int) -> None:
        req = prompt(seed)
        policy.observe(Routed(req, policy.choose(req, fleet(n)).chosen))

    hot = range(192)  # placed over two calls (checked below)
    for seed in hot:
        for _ in range(4):
            route(seed, 5)  # hot from the fourth on, homed over five replicas
    route(hot[0], 8)  # three more joined: the next window's homes are over eight
    ks = [policy._prepare(prompt(seed)).key for seed in hot]
    window = policy._sketch.window
    before = homes_of(policy._placement, ks)
    assert None not in before.values()
    while (policy._routed + 1) % window:
        route(10_000 + policy._routed, 8)  # one-off prompts, up to the window's decision
    assert homes_of(policy._placement, ks) == before
    route(10_000 + policy._routed, 8)  # the window's decision: a pass begun
    assert homes_of(policy._placement, ks) == before
    route(10_000 + policy._routed, 8)  # the next: the pass done, the homes swapped in
    after = homes_of(policy._placement, ks)
    assert set(after.values()) - set(before.values()) and None not in after.values()
    policy.check_integrity()
    assert policy._placement.step < len(hot) <= 2 * policy._placement.step
