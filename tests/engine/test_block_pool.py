import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_pool import BlockPool
from engine.eviction import FrequencyEviction, LRUEviction, make_eviction


def h(i: int) -> bytes:
    return i.to_bytes(32, "big")


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "cache", "hit", "reset"]),
              st.integers(0, 10_000), st.integers(1, 6)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.sampled_from(["lru", "frequency"]))
def test_pool_invariants_under_random_ops(seq: list[tuple[str, int, int]], policy: str) -> None:
    pool = BlockPool(12, policy)
    held: list[list[int]] = []  # block lists owned by fake requests
    for op, x, n in seq:
        if op == "alloc":
            if n <= pool.num_free_blocks:
                held.append(pool.allocate(n))
            else:
                before = pool.num_free_blocks
                with pytest.raises(ValueError):
                    pool.allocate(n)
                assert pool.num_free_blocks == before
        elif op == "free" and held:
            blocks = held.pop(x % len(held))
            pool.free_blocks(reversed(blocks))
        elif op == "cache" and held:
            blocks = held[x % len(held)]
            for i, b in enumerate(blocks):
                pool.cache_blocks([b], [h(x % 7 * 10 + i)])
        elif op == "hit":
            hits = pool.longest_cached_prefix([h(x % 7 * 10 + i) for i in range(n)], n)
            pool.touch(hits)
            held.append(hits)
        elif op == "reset":
            pool.reset_prefix_cache()
        pool.check_integrity()
        assert pool.num_used_blocks == len({b for blocks in held for b in blocks})
    for blocks in held:
        pool.free_blocks(blocks)
    pool.check_integrity()
    assert pool.num_free_blocks == 12


def test_recycled_block_forgets_its_hash() -> None:
    pool = BlockPool(2)
    a = pool.allocate(2)
    assert pool.cache_blocks([a[0]], [h(1)]) == 1
    pool.free_blocks(a)
    b = pool.allocate(2)  # one from free, then evicts the cached one
    assert sorted(b) == sorted(a)
    assert pool.longest_cached_prefix([h(1)], 1) == []
    pool.check_integrity()


def test_duplicate_hash_is_not_registered_twice() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(1), pool.allocate(1)
    assert pool.cache_blocks([a[0]], [h(5)]) == 1
    assert pool.cache_blocks([b[0]], [h(5)]) == 0
    assert pool.cached == {h(5): a[0]}
    pool.free_blocks(a + b)
    pool.check_integrity()
    assert pool.num_evictable_blocks == 1


def _cached_blocks(pool: BlockPool, keys: list[int]) -> list[int]:
    blocks = pool.allocate(len(keys))
    for b, k in zip(blocks, keys, strict=True):
        pool.cache_blocks([b], [h(k)])
    return blocks


def test_lru_evicts_least_recently_freed_tail_first() -> None:
    pool = BlockPool(6, "lru")
    r1 = _cached_blocks(pool, [1, 2, 3])
    r2 = _cached_blocks(pool, [4, 5, 6])
    pool.free_blocks(reversed(r1))  # tail first: block of key 3 is the oldest
    pool.free_blocks(reversed(r2))
    assert isinstance(pool.evictor, LRUEviction)
    assert pool.evictor.order() == [r1[2], r1[1], r1[0], r2[2], r2[1], r2[0]]
    # A hit takes a block out of the queue; freeing it again makes it youngest.
    pool.touch([r1[0]])
    pool.free_blocks([r1[0]])
    victims = pool.allocate(3)
    assert victims == [r1[2], r1[1], r2[2]]
    assert pool.longest_cached_prefix([h(1)], 1) == [r1[0]]
    pool.check_integrity()


def test_frequency_keeps_reused_prefixes_over_one_offs() -> None:
    pool = BlockPool(6, "frequency")
    hot = _cached_blocks(pool, [1, 2])
    pool.evictor.record_uses([h(1), h(2), h(1), h(2)])  # used twice
    pool.free_blocks(reversed(hot))
    cold = _cached_blocks(pool, [7, 8])
    pool.evictor.record_uses([h(7), h(8)])  # used once
    pool.free_blocks(reversed(cold))
    # LRU would evict the hot blocks first (freed earlier); frequency takes the cold ones.
    assert isinstance(pool.evictor, FrequencyEviction)
    assert pool.evictor.order() == [cold[1], cold[0], hot[1], hot[0]]
    got = pool.allocate(4)  # 2 free, then 2 victims
    assert set(got) >= set(cold)
    assert pool.longest_cached_prefix([h(1), h(2)], 2) == hot
    pool.check_integrity()


def test_frequency_counts_decay_and_protected_is_capped() -> None:
    ev = FrequencyEviction(10, decay_period=4, protected_fraction=0.2)  # cap: 2 blocks
    ev.record_uses([h(1)] * 3)
    assert ev.count(h(1)) == 3
    ev.record_uses([h(2)])  # 4th use: every count halves
    assert ev.count(h(1)) == 1
    assert ev.count(h(2)) == 0
    ev.record_uses([h(3), h(3), h(4)])  # 3 uses since the decay: no decay yet
    assert (ev.count(h(3)), ev.count(h(4))) == (2, 1)
    ev.record_uses([h(4), h(5)])  # 5th use: halves (3: 2->1, 4: 2->1, 5: 1->0)
    assert (ev.count(h(3)), ev.count(h(4)), ev.count(h(5))) == (1, 1, 0)
    ev.record_uses([h(3), h(4), h(5)])
    ev.push(30, h(3))  # count 2: protected
    ev.push(40, h(4))  # count 2: protected (2 of 2)
    ev.push(41, h(5))  # count 1: probation
    assert ev.order() == [41, 30, 40]
    ev.decay_period = 100
    ev.record_uses([h(6), h(6)])
    ev.push(50, h(6))  # a third protected block: the oldest (30) is demoted
    assert ev.order() == [41, 30, 40, 50]
    assert ev.pop_victim() == 41
    ev.remove(40)
    assert 40 not in ev and len(ev) == 2
    assert ev.clear() == [30, 50]
    with pytest.raises(IndexError):
        ev.pop_victim()


def test_make_eviction_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown eviction policy 'lfu'"):
        make_eviction("lfu", 4)
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)
