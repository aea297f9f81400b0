import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from policies.base import ReplicaView, RouteRequest
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.ring import MAX_POINTS, Ring, RingCache, stable_hash, token_bytes

REPO = Path(__file__).resolve().parents[2]
VNODES = PrefixAffinityConfig().vnodes


def keys(n: int) -> list[int]:
    return [stable_hash(f"key-{i}".encode()) for i in range(n)]


def ids(n: int) -> list[tuple[str, float]]:
    return [(f"replica-{i}", 1.0) for i in range(n)]


@pytest.mark.parametrize("replicas", [8, 64])
def test_spread_with_default_vnodes(replicas: int) -> None:
    ring = Ring(ids(replicas), VNODES)
    per = Counter(ring.owner(k) for k in keys(replicas * 2000))
    assert len(per) == replicas
    mean = replicas * 2000 / replicas
    assert max(per.values()) / mean <= 1.15, per.most_common(3)


def test_spread_follows_weights() -> None:
    members = [*ids(4), ("heavy", 2.0)]
    ring = Ring(members, 256)
    per = Counter(ring.owner(k) for k in keys(30_000))
    share = per["heavy"] / 30_000
    assert 2 / 6 * 0.85 < share < 2 / 6 * 1.15, share


@pytest.mark.parametrize("replicas", [8, 64])
def test_removing_one_moves_only_its_keys(replicas: int) -> None:
    before = Ring(ids(replicas), VNODES)
    gone = "replica-3"
    after = Ring([m for m in ids(replicas) if m[0] != gone], VNODES)
    sample = keys(20_000)
    moved = [k for k in sample if before.owner(k) != after.owner(k)]
    assert all(before.owner(k) == gone for k in moved), "a key moved off a remaining replica"
    assert len(moved) == sum(before.owner(k) == gone for k in sample)
    share = len(moved) / len(sample)
    assert 0.75 / replicas < share < 1.3 / replicas, share


def test_walk_visits_each_replica_once() -> None:
    ring = Ring(ids(16), 32)
    for k in keys(50):
        order = list(ring.walk(k))
        assert sorted(order) == sorted(r for r, _ in ids(16))
        assert order[0] == ring.owner(k)


def test_token_bytes_are_little_endian_u32() -> None:
    assert bytes(token_bytes([1, 0x01020304])) == b"\x01\x00\x00\x00\x04\x03\x02\x01"
    with pytest.raises(OverflowError):
        token_bytes([2**32])


_ROUTE_SCRIPT = """
import json, sys
from policies.base import ReplicaView, RouteRequest
from policies.prefix_affinity import PrefixAffinity
policy = PrefixAffinity()
views = [ReplicaView(f"replica-{i}") for i in range(12)][::-1]
out = []
for i in range(300):
    tokens = [(i * 7919 + j * 31) % 50000 for j in range(40 + i % 7)]
    key = f"doc-{i}" if i % 3 == 0 else None
    out.append(policy.choose(RouteRequest(tokens, 900, affinity_key=key), views).ranked)
print(json.dumps([list(sorted(policy.ring(views).points[:50])), out]))
"""


def _route_in_process(seed: str) -> list:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", _ROUTE_SCRIPT],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=True,
    )
    return json.loads(proc.stdout)


def test_two_processes_build_the_same_ring_and_route_the_same() -> None:
    first, second = _route_in_process("1"), _route_in_process("2")
    assert first == second
    points, ranked = first
    assert len(points) == 50 and len({tuple(r) for r in ranked}) > 10
    # and this process agrees too, with replicas listed in another order
    policy = PrefixAffinity()
    views = [ReplicaView(f"replica-{i}") for i in range(12)]
    for i in (0, 1, 2, 299):
        tokens = [(i * 7919 + j * 31) % 50000 for j in range(40 + i % 7)]
        key = f"doc-{i}" if i % 3 == 0 else None
        d = policy.choose(RouteRequest(tokens, 900, affinity_key=key), views)
        assert d.chosen == ranked[i][0]


def test_ring_layout_is_pinned() -> None:
    """Golden points and owners: every gateway copy, of any version, must agree on them.
    A change here (say, in the ring library) moves keys between replicas."""
    ring = Ring([("a", 1.0), ("b", 1.0), ("c", 2.0), ("d", 1.0)], 16)
    assert len(ring.points) == 80
    assert ring.points[:3] == [123850353220105897, 307072897853580858, 347653229373065393]
    keys = [0, 1 << 60, 3 << 61, 12345678901234567, (1 << 64) - 1, 7 << 58]
    assert [ring.owner(k) for k in keys] == ["c", "d", "a", "c", "c", "c"]


@pytest.mark.parametrize("weights", [(1.0, 1.0, 1.0), (1.0, 2.5, 0.5, 1.0)])
def test_layout_is_uhashrings_with_our_hash(weights: tuple[float, ...]) -> None:
    """Keys keep the replicas they had when uhashring laid the ring out."""
    from uhashring import HashRing

    members = [(f"r{i}", w) for i, w in enumerate(weights)]
    ring = Ring(members, vnodes=40)
    nodes = {rid: {"vnodes": max(1, round(40 * w)), "weight": 1} for rid, w in sorted(members)}
    theirs = HashRing(nodes=nodes, hash_fn=lambda label: stable_hash(label.encode()))
    assert list(zip(ring.points, ring.owners, strict=True)) == theirs.get_points()


def test_a_ring_is_bounded() -> None:
    # weights of 100 on every replica built 100 times the points of weights 1 (8 replicas
    # at prefix_affinity's 1,024 virtual nodes: 1.5 s on the event loop)
    assert len(Ring([("a", 0.5), ("b", 100.0)], 1024).points) <= MAX_POINTS


@pytest.mark.parametrize(("fleet", "joining"), [
    ([(f"big-{i}", 2.0) for i in range(8)], ("small", 1.0)),  # half the others' weight
    ([(f"r{i}", 1.5) for i in range(4)] + [(f"s{i}", 3.0) for i in range(4)], ("t", 0.5)),
])
def test_a_lighter_replica_joining_moves_only_the_keys_it_takes(
        fleet: list[tuple[str, float]], joining: tuple[str, float]) -> None:
    # the least weight was the unit of every member's points: a lighter replica joining
    # (or the only lightest leaving) changed every other's, and moved 46% of the keys
    before, after = Ring(fleet, 256), Ring([*fleet, joining], 256)
    sample = keys(6000)
    moved = [k for k in sample if before.owner(k) != after.owner(k)]
    assert all(after.owner(k) == joining[0] for k in moved), "a key moved between the others"
    share = joining[1] / (sum(w for _, w in fleet) + joining[1])
    assert len(moved) / len(sample) < 1.5 * share, (len(moved) / len(sample), share)


def test_the_rings_of_many_memberships_in_turn_are_built_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # five tenants' partitions in turn: with four rings kept, one was built at every
    # decision
    built: list[int] = []
    real = Ring.__init__

    def counting(self: Ring, members: Any, vnodes: int) -> None:
        built.append(1)
        real(self, members, vnodes)

    monkeypatch.setattr(Ring, "__init__", counting)
    cache = RingCache(16)
    partitions = [[f"r{p}{i}" for i in range(3)] for p in range(6)]
    for _ in range(3):
        for ids in partitions:
            cache.layout(ids, [1.0] * 3)
    assert len(built) == 6


def test_a_layout_follows_the_ids_even_when_the_callers_list_is_changed_in_place() -> None:
    # the last layout is kept for the last ids and weights seen: a copy of them, so a
    # caller that reuses its list gets the layout of what the list holds now
    cache = RingCache(16)
    ids, weights = ["a", "b", "c"], [1.0, 1.0, 1.0]
    first = cache.layout(ids, weights)
    assert cache.layout(["a", "b", "c"], [1.0, 1.0, 1.0]) is first
    ids[0], ids[2] = "c", "a"
    ring, owners = cache.layout(ids, weights)
    assert [ids[i] for i in owners] == ring.owners
    weights[1] = 2.0
    assert cache.layout(ids, weights)[0].members == {"c": 1.0, "b": 2.0, "a": 1.0}


def test_members_points_are_kept_for_the_next_ring_and_bounded() -> None:
    import policies.ring as ring_module

    members = [(f"keep-{i}", 1.0) for i in range(8)]
    first = Ring(members, 64)
    again = Ring([*members, ("keep-new", 1.0)], 64)  # seven members' points from the kept
    ring_module._points_kept.clear()
    fresh = Ring([*members, ("keep-new", 1.0)], 64)
    assert (again.points, again.owners) == (fresh.points, fresh.owners)
    assert set(first.owners) < set(again.owners)
    Ring([(f"many-{i}", 1.0) for i in range(ring_module._POINTS_KEPT + 10)], 1)
    assert len(ring_module._points_kept) == ring_module._POINTS_KEPT
