"""A cache model of many entries leaves the garbage collector little to walk: each full
collection walks every tracked object, and one per modelled block held the event loop
for 100-300 ms at a time in front of replicas of millions of tokens."""

import gc

from kvwire.kv_event_format import BlockStored
from policies.cache_model import ChainEntry, ReplicaCacheModel
from policies.kv_index import KVIndex


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_a_models_entries_are_not_objects_the_collector_tracks() -> None:
    model = ReplicaCacheModel(capacity=10**9)
    before = _tracked()
    for doc in range(200):
        chain = [ChainEntry(doc * 1000 + i, 16) for i in range(100)]
        model.admit(chain, owner=doc, pending=[] if doc % 2 else None)
    assert len(model) == 20_000
    # the model's own containers, not one object per entry (the rest is the run's noise)
    assert _tracked() - before < 2_000


def test_entries_replaced_on_a_touch_keep_what_they_held() -> None:
    """A guard of the rewrite, not of a defect (it passed before it too): an entry
    replaced on a touch keeps its size, owner and pending admissions."""
    model = ReplicaCacheModel(capacity=100)
    pending: list[tuple[int, int]] = []
    model.admit([ChainEntry(1, 10), ChainEntry(2, 10)], owner=7, pending=pending)
    model.admit([ChainEntry(1, 10), ChainEntry(2, 20)], owner=8)  # grows, takes it over
    assert model.match([ChainEntry(1, 10), ChainEntry(2, 20)]) == 30
    assert model.used == 30
    assert model.forget(pending) == []  # the second admission stood: held for good
    model.check_integrity()


def test_the_kv_event_index_holds_its_blocks_in_maps_the_collector_does_not_walk() -> None:
    index = KVIndex(block_size=4)
    for seq in range(100):
        hashes = tuple(seq * 1000 + i for i in range(50))
        tokens = tuple(range(seq * 200, seq * 200 + 200))
        index.apply("r0", seq, [BlockStored(hashes, None, tokens, 4)])
    assert index.num_blocks("r0") == 5_000
    index.check_integrity()
    replica = index._replicas["r0"]
    # maps of ints only: the collector neither tracks nor walks them
    assert not any(gc.is_tracked(m) for m in (replica.by_hash, replica.copies, replica.keys))
