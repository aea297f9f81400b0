"""A consistent hash ring of replicas with virtual nodes, keyed by a stable 64-bit hash.

Replica ``r`` with ``n`` virtual nodes owns the points ``stable_hash(f"{r}-{i}")`` for
``i < n`` (the same in every process: never Python's salted ``hash()``); replicas are laid
out in id order and a point two of them hash to goes to the later one. This is the layout
uhashring's ``HashRing`` builds with our hash function, so keys map to the replicas they
always did; the ring is ours so that lookups read two parallel arrays, a walk costing a
bisect plus a few list reads:

    points[i]  sorted 64-bit point positions          owners[i]  replica id at points[i]

A key maps to the first point at or after its hash (wrapping to 0). ``walk`` yields the
distinct replicas met from there on, which is the order "consistent hashing with bounded
loads" tries them in.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from hashlib import blake2b
from typing import TypeVar

import numpy as np

from kvwire.bounded_memo import BoundedMemo

_LITTLE_ENDIAN = sys.byteorder == "little"
_T = TypeVar("_T", bound=Hashable)


def stable_hash(data: bytes | memoryview) -> int:
    """64-bit blake2b of ``data`` as an unsigned int: the same in every process."""
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def _hash_point(label: str) -> int:
    return stable_hash(label.encode("utf-8"))


def token_bytes(tokens: Sequence[int]) -> memoryview:
    """Token ids as little-endian u32 bytes (``OverflowError`` for ids outside u32)."""
    if isinstance(tokens, array) and tokens.typecode == "I":
        arr = tokens
    else:
        arr = array("I")  # fromlist: a tenth faster than array("I", tokens) from a list
        arr.fromlist(tokens if isinstance(tokens, list) else list(tokens))
    if not _LITTLE_ENDIAN:
        arr = array("I", arr)
        arr.byteswap()
    return memoryview(arr).cast("B")


# the most points a ring holds (weights scaled down past it): a ring is built on the event
# loop, and weights of 100 on every replica once made it 100 times the ring of weights 1
MAX_POINTS = 1 << 18
# members' points kept for the next ring (the least recently used let go first): a ring is
# rebuilt at every membership change, and hashing every member's points again took 0.7 s
# of the event loop for 256 replicas at 1,024 points each (each model's policy builds its
# own); 8 KB a member of 1,024 points
_POINTS_KEPT = 4096
_points_kept: BoundedMemo[tuple[str, int], np.ndarray] = BoundedMemo(_POINTS_KEPT)


def member_points(rid: str, count: int) -> np.ndarray:
    """The ``count`` ring points of replica ``rid`` (``stable_hash(f"{rid}-{i}")``, as
    uint64), hashed once and kept for the rings built after."""
    key = (rid, count)
    points = _points_kept.get(key, None)
    if points is None:
        points = np.fromiter((_hash_point(f"{rid}-{i}") for i in range(count)), np.uint64,
                             count)
        _points_kept.put(key, points)
    return points


class Ring:
    """An immutable ring over ``members`` (replica id, weight); ``vnodes`` points per
    unit of weight, at most ``MAX_POINTS`` in all (past it every member's points are
    scaled down alike); members with weight <= 0 are left off. Build a new one when they
    change.

    A member's points depend on its own weight alone, never on the others' (while the
    ring is under ``MAX_POINTS``): a unit taken from the least weight doubled every other
    member's points when a replica of half their weight joined, and moved 46% of the keys
    of eight replicas of weight 2 instead of the newcomer's 6%."""

    __slots__ = ("members", "owners", "points", "vnodes")

    def __init__(self, members: Iterable[tuple[str, float]], vnodes: int) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.members: dict[str, float] = {rid: w for rid, w in members if w > 0}
        self.vnodes = vnodes
        counts = {rid: vnodes * w for rid, w in self.members.items()}
        scale = min(1.0, MAX_POINTS / max(1.0, sum(counts.values())))
        ids = sorted(counts)
        if not ids:
            self.points: list[int] = []
            self.owners: list[str] = []
            return
        each = [member_points(rid, max(1, round(counts[rid] * scale))) for rid in ids]
        points = np.concatenate(each)
        owner = np.repeat(np.arange(len(ids)), [len(p) for p in each])
        order = np.argsort(points, kind="stable")  # equal points keep the members' id order
        points, owner = points[order], owner[order]
        # a point two members hash to goes to the later one in id order: the last of a run
        last = np.append(points[1:] != points[:-1], True)
        self.points = points[last].tolist()
        self.owners = [ids[i] for i in owner[last].tolist()]

    def __len__(self) -> int:
        return len(self.members)

    def owner(self, key: int) -> str:
        """The replica owning ``key`` (a 64-bit hash); ``LookupError`` on an empty ring."""
        for rid in self.walk(key):
            return rid
        raise LookupError("empty ring")

    def walk(self, key: int) -> Iterator[str]:
        """Distinct replicas in ring order starting at ``key``'s position."""
        return walk(self.points, self.owners, len(self.members), key)

    def indexed(self, order: Sequence[str]) -> list[int]:
        """``owners`` as positions in ``order`` (which must list every member), for walks
        that read per-replica facts from parallel lists."""
        where = {rid: i for i, rid in enumerate(order)}
        return [where[rid] for rid in self.owners]


def walk(points: list[int], owners: Sequence[_T], distinct: int, key: int) -> Iterator[_T]:
    """Distinct owners in ring order from the first point at or after ``key``."""
    n = len(points)
    if n == 0:
        return
    start = bisect_left(points, key)
    seen: set[_T] = set()
    for i in range(start, start + n):
        owner = owners[i - n] if i >= n else owners[i]
        if owner not in seen:
            seen.add(owner)
            yield owner
            if len(seen) == distinct:
                return


class RingCache:
    """Rings by membership, and their owners as positions in the order replicas came in;
    both kept for the memberships and orders used last (up to ``_KEEP``, the least
    recently used let go first: a tenant's partition is a membership of its own), so a
    decision never rebuilds one."""

    _KEEP = 16

    def __init__(self, vnodes: int) -> None:
        self.vnodes = vnodes
        self._rings: OrderedDict[tuple[tuple[str, float], ...], Ring] = OrderedDict()
        self._layouts: OrderedDict[tuple[tuple[str, ...], tuple[float, ...]],
                                   tuple[Ring, list[int]]] = OrderedDict()
        self._last: tuple[list[str], list[float], tuple[Ring, list[int]]] | None = None

    def layout(self, ids: Sequence[str], weights: Sequence[float]) -> tuple[Ring, list[int]]:
        """The ring over these replicas and its owners as positions in ``ids``."""
        last = self._last
        if last is not None and last[0] == ids and last[1] == weights:
            return last[2]  # most decisions see the last membership: compared as lists
        order = (tuple(ids), tuple(weights))
        layout = self._layouts.get(order)
        if layout is not None:
            self._layouts.move_to_end(order)
        else:
            members = tuple(sorted(zip(ids, weights, strict=True)))
            ring = self._rings.get(members)
            if ring is not None:
                self._rings.move_to_end(members)
            else:
                ring = self._rings[members] = Ring(members, self.vnodes)
                while len(self._rings) > self._KEEP:
                    self._rings.popitem(last=False)
            layout = self._layouts[order] = (ring, ring.indexed(ids))
            while len(self._layouts) > self._KEEP:
                self._layouts.popitem(last=False)
        self._last = (list(ids), list(weights), layout)
        return layout
