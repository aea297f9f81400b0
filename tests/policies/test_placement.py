import random

from policies.placement import HotPlacement
from policies.ring import Ring, stable_hash

REPLICAS = [f"r{i}" for i in range(6)]
RING = Ring([(r, 1.0) for r in REPLICAS], 256)
DOC = 1500  # tokens a hot key's prompt holds


def keys(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [stable_hash(rng.randbytes(8)) for _ in range(n)]


def place_all(placement: HotPlacement, ks: list[int], room: int,
              replicas: list[str] = REPLICAS) -> dict[int, str]:
    out = {}
    for k in ks:
        home = placement.place(k, DOC, [r for r in RING.walk(k) if r in replicas],
                               lambda r: room)
        assert home is not None
        out[k] = home
    placement.check_integrity()
    return out


def counts(homes: dict[int, str]) -> list[int]:
    return sorted(list(homes.values()).count(r) for r in REPLICAS)


def test_hot_keys_fill_every_cache_before_any_overflows() -> None:
    ks = keys(50)
    ring_only = counts({k: RING.owner(k) for k in ks})
    homes = place_all(HotPlacement(slack=0.05), ks, room=8 * DOC)
    # ring hashing alone leaves some replicas short and others over 8 (what LRU caches of
    # 8 documents thrash on); bounded placement fills each to 8, then shares the rest
    assert ring_only[0] < 8 < ring_only[-1]
    assert counts(homes) == [8, 8, 8, 8, 9, 9]


def test_overflow_is_shared_evenly_when_the_hot_set_exceeds_the_fleet() -> None:
    homes = place_all(HotPlacement(slack=0.05), keys(120), room=8 * DOC)
    assert max(counts(homes)) - min(counts(homes)) <= 2


def test_a_key_keeps_its_home_and_the_first_ring_replica_when_there_is_room() -> None:
    placement = HotPlacement()
    ks = keys(10)
    homes = place_all(placement, ks, room=100 * DOC)
    assert homes == {k: RING.owner(k) for k in ks}  # room everywhere: plain ring order
    again = place_all(placement, ks, room=1)  # a later call keeps the homes
    assert again == homes


def test_only_a_departed_replicas_keys_move() -> None:
    placement = HotPlacement()
    ks = keys(48)
    homes = place_all(placement, ks, room=8 * DOC)
    placement.forget_replica("r2")
    left = [r for r in REPLICAS if r != "r2"]
    after = place_all(placement, ks, room=8 * DOC, replicas=left)
    moved = {k for k in ks if after[k] != homes[k]}
    assert moved == {k for k in ks if homes[k] == "r2"}


def test_rebalance_unplaces_the_newest_keys_of_a_replica_past_its_bound() -> None:
    placement = HotPlacement(slack=0.0)
    ks = keys(30)
    # placed while only r0 and r1 could take them: 15 each, past a room of 8
    place_all(placement, ks, room=8 * DOC, replicas=["r0", "r1"])
    assert placement.tokens_on("r0") + placement.tokens_on("r1") == 30 * DOC
    # r2..r5 became eligible: both are now past max(room, fair share of 5 per replica)
    moved = placement.rebalance(REPLICAS, lambda r: 8 * DOC)
    placement.check_integrity()
    assert moved == 14 and placement.tokens_on("r0") == placement.tokens_on("r1") == 8 * DOC
    assert len(placement) == 16
    homes = place_all(placement, ks, room=8 * DOC)
    assert max(counts(homes)) <= 8


def test_prune_forgets_keys_no_longer_hot() -> None:
    placement = HotPlacement()
    ks = keys(20)
    place_all(placement, ks, room=8 * DOC)
    assert placement.prune(lambda k: k in ks[:5]) == 15
    assert len(placement) == 5
    placement.check_integrity()
