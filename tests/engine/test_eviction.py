"""The eviction queues' bulk operations against one-block-at-a-time reference models."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_pool import BlockPool
from engine.eviction import FrequencyEviction, LRUEviction


def h(i: int) -> bytes:
    return i.to_bytes(32, "big")


class RefFrequency:
    """Segmented LRU written one block at a time."""

    def __init__(self, cap: int, min_count: int, decay_period: int) -> None:
        self.cap, self.min_count, self.decay_period = cap, min_count, decay_period
        self.counts: Counter[bytes] = Counter()
        self.uses = 0
        self.probation: list[int] = []
        self.protected: list[int] = []
        self.hash_of: dict[int, bytes] = {}

    def record_uses(self, hashes: list[bytes]) -> None:
        self.counts.update(hashes)
        self.uses += len(hashes)
        if self.uses >= self.decay_period:
            self.uses = 0
            self.counts = Counter({k: c >> 1 for k, c in self.counts.items() if c > 1})

    def push_many(self, ids: list[int], hashes: list[bytes]) -> None:
        """Hot blocks first (each may demote protected's oldest), then the cold ones; unless
        the hot ones are used less often, on average, than the protected blocks they would
        demote: then every block goes to probation, in order."""
        self.hash_of.update(zip(ids, hashes, strict=True))
        hot = [self.counts[x] >= self.min_count for x in hashes]
        hot_uses = [self.counts[x] for x in hashes if self.counts[x] >= self.min_count]
        excess = len(self.protected) + len(hot_uses) - self.cap
        if hot_uses and excess > 0 and self.protected:
            victims = self.protected[:excess]
            victim_mean = sum(self.counts[self.hash_of[v]] for v in victims) / len(victims)
            if sum(hot_uses) / len(hot_uses) < victim_mean:
                self.probation += ids
                return
        for b, is_hot in zip(ids, hot, strict=True):
            if is_hot:
                self.protected.append(b)
                if len(self.protected) > self.cap:
                    self.probation.append(self.protected.pop(0))
        self.probation += [b for b, is_hot in zip(ids, hot, strict=True) if not is_hot]

    def remove(self, b: int) -> None:
        (self.probation if b in self.probation else self.protected).remove(b)

    def pop_victim(self) -> int:
        return (self.probation or self.protected).pop(0)


# (op, block-id sample, count): ops act on a pool of 24 block ids.
freq_ops = st.lists(
    st.tuples(st.sampled_from(["push", "remove", "pop", "use"]),
              st.lists(st.integers(0, 23), max_size=8), st.integers(1, 8)),
    max_size=50,
)


@settings(max_examples=200, deadline=None)
@given(freq_ops, st.integers(0, 6), st.integers(1, 3), st.integers(1, 40))
def test_frequency_bulk_ops_match_one_at_a_time(ops, cap, min_count, decay) -> None:
    q = FrequencyEviction(24, min_count=min_count, decay_period=decay)
    q.protected_cap = cap
    ref = RefFrequency(cap, min_count, decay)
    for op, sample, n in ops:
        if op == "use":
            hashes = [h(b % 5) for b in sample]
            q.record_uses(hashes)
            ref.record_uses(hashes)
        elif op == "push":
            ids = [b for b in dict.fromkeys(sample) if b not in q]
            hashes = [h(b % 5) for b in ids]
            q.push_many(ids, hashes)
            ref.push_many(ids, hashes)
        elif op == "remove":
            ids = [b for b in dict.fromkeys(sample) if b in q]
            q.remove_many(ids)
            for b in ids:
                ref.remove(b)
        else:
            k = min(n, len(q))
            assert q.pop_victims(k) == [ref.pop_victim() for _ in range(k)]
        assert q.order() == ref.probation + ref.protected
        assert len(q) == len(ref.probation) + len(ref.protected)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 15), max_size=6)),
                max_size=40))
def test_lru_bulk_ops_match_a_list(ops) -> None:
    q, ref = LRUEviction(), []
    for push, sample in ops:
        ids = list(dict.fromkeys(sample))
        if push:
            ids = [b for b in ids if b not in q]
            q.push_many(ids, [h(b) for b in ids])
            ref += ids
        else:
            k = len(ids) % (len(q) + 1)
            assert q.pop_victims(k) == ref[:k]
            del ref[:k]
        assert q.order() == ref


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=120), st.integers(-3, 130))
def test_longest_cached_prefix_is_the_first_run(present, max_blocks) -> None:
    pool = BlockPool(len(present) + 1)
    hashes = [h(i) for i in range(len(present))]
    blocks = pool.allocate(len(present))
    pool.cache_blocks([b for b, p in zip(blocks, present, strict=True) if p],
                      [x for x, p in zip(hashes, present, strict=True) if p])
    expected = []
    for b, p in zip(blocks, present[:max_blocks], strict=False):
        if not p:
            break
        expected.append(b)
    assert pool.longest_cached_prefix(hashes, max_blocks) == expected
    pool.check_integrity()


def test_frequency_admission_keeps_often_used_blocks_protected() -> None:
    q = FrequencyEviction(8, min_count=2, protected_fraction=0.5)  # protected holds 4
    popular = [h(i) for i in range(4)]
    for _ in range(6):
        q.record_uses(popular)
    q.push_many([0, 1, 2, 3], popular)
    assert q.order() == [0, 1, 2, 3]  # all protected
    twice = [h(10), h(11)]
    q.record_uses(twice + twice)  # reused, but less than the protected blocks
    q.push_many([4, 5], twice)
    assert q.pop_victims(2) == [4, 5]  # not admitted: they go first, the popular stay
    for _ in range(8):
        q.record_uses(twice)
    q.push_many([4, 5], twice)  # now used more often: admitted, demoting the oldest two
    assert q.order() == [0, 1, 2, 3, 4, 5]
    assert q.pop_victims(2) == [0, 1]
