import random
import struct
from collections import Counter

import pytest

from policies.base import ReplicaView, Routed, RouteRequest
from policies.common_prefix import CommonPrefixLearner
from policies.cost import Cost, CostConfig


def ids(tokens: list[int]) -> memoryview:
    return memoryview(struct.pack(f"<{len(tokens)}I", *tokens))


class BruteForce:
    """The learner's definition, recounted from scratch after every prompt."""

    def __init__(self, block: int, share: float, window: int, min_samples: int,
                 max_depth: int) -> None:
        self.block, self.share, self.window = block, share, window
        self.min_samples, self.max_depth = min_samples, max_depth
        self.recent: list[tuple[object, bool, list[tuple[int, ...]]]] = []

    def observe(self, tokens: list[int], n: int, prompt_tokens: int, fp: object) -> None:
        repeat = fp is not None and any(f == fp for f, _, _ in self.recent)
        limit = min(n, prompt_tokens - 1, self.max_depth)
        prefixes = [] if repeat else [tuple(tokens[:b]) for b in
                                      range(self.block, limit + 1, self.block)]
        self.recent = [*self.recent, (fp, not repeat, prefixes)][-self.window:]

    def common(self) -> set[tuple[int, ...]]:
        counted = [p for _, c, p in self.recent if c]
        if len(counted) < self.min_samples:
            return set()
        counts = Counter(prefix for prefixes in counted for prefix in prefixes)
        return {p for p, c in counts.items() if c >= self.share * len(counted)}

    def skip(self, tokens: list[int]) -> int:
        common = self.common()
        depth = max(map(len, common), default=0)
        skip = 0
        for b in range(self.block, min(len(tokens) - 1, depth) + 1, self.block):
            if tuple(tokens[:b]) not in common:
                break
            skip = b
        return skip


@pytest.mark.parametrize("seed", range(4))
def test_the_learner_agrees_with_a_recount_of_its_window(seed: int) -> None:
    rng = random.Random(seed)
    kw = dict(block=4, share=0.5, window=24, min_samples=6, max_depth=48)
    learner, brute = CommonPrefixLearner(**kw), BruteForce(**kw)  # type: ignore[arg-type]
    heads = [[rng.randrange(40) for _ in range(rng.randrange(16, 40))] for _ in range(2)]
    depths = set()
    for step in range(1500):
        head = heads[(step // 300) % 2] if rng.random() < 0.75 else rng.choice(heads)
        tokens = head + [rng.randrange(4) for _ in range(rng.randrange(1, 50))]
        fp = rng.randrange(20) if rng.random() < 0.3 else None
        n = min(len(tokens), rng.randrange(1, 70))
        learner.observe(ids(tokens), n, len(tokens), fp)
        brute.observe(tokens, n, len(tokens), fp)
        expected = max(map(len, brute.common()), default=0)
        assert learner.depth == expected, step  # refreshed every prompt in a small window
        probe = rng.choice(heads) + [rng.randrange(4) for _ in range(rng.randrange(1, 20))]
        assert learner.skip(ids(probe), len(probe)) == brute.skip(probe), step
        depths.add(expected)
        # every digest counted hangs in the tree once, and nothing else does
        links = len(learner._first) + sum(map(len, learner._more.values()))
        assert links == len(learner._counts), step
    assert len(depths) > 3  # the common prefix grew and shrank as the traffic moved


@pytest.mark.parametrize("common_block", [8, 4])
def test_cost_learns_a_shared_system_prompt_and_keys_what_follows(common_block: int) -> None:
    # 8: the learner counts the cache model's chain keys; 4: digests of its own
    policy = Cost(CostConfig(common_block=common_block, common_min_samples=16))
    rng = random.Random(0)
    system = [rng.randrange(50_000) for _ in range(1024)]  # 64 pieces, past K's 16

    def req(doc: int) -> RouteRequest:
        r = random.Random(doc)
        tokens = system + [r.randrange(50_000) for _ in range(800)]
        return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m")

    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=1_000_000) for i in range(4)]
    assert policy._prepare(req(1)).key == policy._prepare(req(2)).key  # nothing learned yet
    for doc in range(40):
        r = req(doc)
        policy.observe(Routed(r, policy.choose(r, fleet).chosen))
    # keyed past the learned prefix
    assert policy._prepare(req(1)).key != policy._prepare(req(2)).key
    assert policy.describe()["common_prefix_chunks"] == 64


def test_cost_learns_a_system_prompt_longer_than_its_lookahead_a_step_at_a_time() -> None:
    # each prompt is counted 16 pieces past what was learned: 64 pieces take 4 steps
    policy = Cost(CostConfig(common_lookahead=16, common_window=64, common_min_samples=16))
    rng = random.Random(1)
    system = [rng.randrange(50_000) for _ in range(1024)]  # 64 pieces
    fleet = [ReplicaView(f"r{i}", kv_capacity_tokens=1_000_000) for i in range(4)]
    depths = []
    for doc in range(400):
        r = random.Random(doc)
        tokens = system + [r.randrange(50_000) for _ in range(800)]
        req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m")
        policy.observe(Routed(req, policy.choose(req, fleet).chosen))
        depths.append(policy.describe()["common_prefix_chunks"])
    assert sorted(set(depths)) == [0, 16, 32, 48, 64]  # never past the lookahead at once
    assert depths[-1] == 64
