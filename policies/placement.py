"""Homes for hot prefix keys: ring order, with bounded load per replica.

Ring hashing alone gives replicas an uneven share of the hot set (with 50 hot documents
over 6 replicas, 4 on one and 11 on another): in front of an LRU cache that holds 8, the
replica with 11 thrashes while the one with 4 wastes room. ``HotPlacement`` walks the ring
from each key, as consistent hashing does, but passes over a replica once the hot keys
already placed there would exceed its bound (consistent hashing with bounded loads)::

    bound(r) = max(room(r), fair)                     in tokens
    room(r)  = the tokens the replica's cache holds (the caller's estimate)
    fair     = tokens of all placed keys / eligible replicas x (1 + slack)

With an overflow set (``cost``: its scratch replicas), a key that fits no eligible
replica's room goes to the first overflow replica in ring order whose room still holds it,
instead of overfilling a home: in front of LRU caches and a hot set of N equally popular
keys over room for C, every home hits C/N of them, while a home filled to its room hits
nearly all and the overflow keys still hit on the overflow set as often as its churn
allows. Only when the overflow set is full too does the fair share apply.

Keys are walked in ascending order of the key, never in the order they turned hot, so the
homes are a function of the key set (and the rooms): gateway copies that each see a random
share of the traffic see the same hot keys and agree on every home without talking. (With
homes placed first come, first served, two copies disagreed on a fifth of the keys, gave
those documents two homes each, and fell from 0.71 to 0.48 token hit rate in the
simulator.) A key keeps its home while the set is unchanged; the whole set is placed again
when a key joins it (turns hot, or lost its home; past ``REASSIGN_ON_JOIN`` keys only the
new key is placed then, first fit), and whenever the owner calls ``assign`` or
``begin_assign`` (``cost``: at each sketch window, after ``prune``). A replica leaving moves
its own keys and few others.

``begin_assign`` spreads that work over the owner's next calls (``cost``: one per routing
decision): each ``advance`` places ``step`` keys of a pass over the set as it stood then
(8,192 keys over 64 replicas at once held one decision for ~30 ms), and the homes stay
those of the last finished pass until the new one is done, then are replaced at once: a
home is never read from a half-done pass. Keys placed or dropped meanwhile keep what
they have then.

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from heapq import heapify, heappop
from itertools import chain
from typing import NamedTuple

# up to this many placed keys, a key joining reassigns the whole set at once (about 1.5 ms
# at 512 keys over 64 replicas); past it, the whole set waits for the next ``assign``
REASSIGN_ON_JOIN = 512
# keys one ``advance`` places (about 1 ms over 64 replicas), or more where ``limit`` keys
# would take over _PASS_CALLS calls: a pass ends well within a sketch window (>= 256)
ASSIGN_STEP = 128
_PASS_CALLS = 128
OrderOf = Callable[[int], Iterator[str]]  # a key's eligible replicas, in ring order


class Placed(NamedTuple):
    replica: str
    tokens: int


class Overflow(NamedTuple):
    """Where hot keys go that no eligible replica has room for: ``replicas``, and a key's
    order over them (ring order from the key)."""

    replicas: Collection[str]
    order_of: OrderOf


class HotPlacement:
    """Bounded-load homes for hot keys; see the module docstring."""

    __slots__ = ("_keys", "_pass", "_tokens", "_want", "limit", "slack", "step")

    def __init__(self, slack: float = 0.05, limit: int = 8192, step: int | None = None
                 ) -> None:
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack!r}")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        if step is not None and step < 1:
            raise ValueError(f"step must be >= 1 or None, got {step!r}")
        self.slack = slack
        self.limit = limit
        self._keys: dict[int, Placed] = {}  # each wanted key's home
        self._tokens: dict[str, int] = {}
        self._want: dict[int, int] = {}  # key -> its tokens, oldest first
        self._pass: _Pass | None = None  # the assignment under way (``begin_assign``)
        # keys placed per ``advance``
        self.step = max(ASSIGN_STEP, -(-limit // _PASS_CALLS)) if step is None else step

    def __len__(self) -> int:
        return len(self._keys)

    def home_of(self, key: int) -> str | None:
        placed = self._keys.get(key)
        return None if placed is None else placed.replica

    @property
    def total_tokens(self) -> int:
        """Tokens of every placed key."""
        return sum(self._tokens.values())

    def tokens_on(self, replica: str) -> int:
        """Tokens of the hot keys placed on ``replica``."""
        return self._tokens.get(replica, 0)

    def place(self, key: int, tokens: int, order_of: OrderOf, eligible: Collection[str],
              room: Callable[[str], int], overflow: Overflow | None = None) -> str | None:
        """The home of ``key``: its current one if that is still in ``eligible`` (or in the
        overflow set), else (the key is new, or its home left) the key joins the placed set
        and every home is assigned again (``assign``). ``order_of(key)`` yields the eligible
        replicas in ring order from a key, lazily: most keys stop at the first. ``None``
        when nothing is eligible."""
        if not eligible:
            return None
        placed = self._keys.get(key)
        if placed is not None and (placed.replica in eligible or (
                overflow is not None and placed.replica in overflow.replicas)):
            return placed.replica
        if key not in self._want and len(self._want) >= self.limit:
            oldest = next(iter(self._want))
            del self._want[oldest]
            self._touch(oldest)
            if oldest in self._keys:
                self._drop(oldest)
        self._want[key] = tokens
        self._touch(key)
        if len(self._want) <= REASSIGN_ON_JOIN:
            self.assign(order_of, eligible, room, overflow)
            placed = self._keys.get(key)
            return None if placed is None else placed.replica
        # a large set: only the new key is placed now (first fit over the current homes),
        # the whole set at the next ``assign``, so a request never pays for thousands
        if placed is not None:
            self._drop(key)
        filling = _Filling(self._tokens, room, tokens, eligible, overflow)
        home = self._first_fit(key, tokens, order_of, filling, self._fair(eligible), overflow)
        self._keys[key] = Placed(home, tokens)
        return home

    def copy(self) -> HotPlacement:
        """The placed set and its homes as they are now, to place keys on without changing
        these (``/admin/explain``); without a pass under way (``assign`` starts its own)."""
        out = HotPlacement(self.slack, self.limit, self.step)
        out._keys, out._tokens, out._want = dict(self._keys), dict(self._tokens), \
            dict(self._want)
        return out

    def assign(self, order_of: OrderOf, eligible: Collection[str],
               room: Callable[[str], int], overflow: Overflow | None = None) -> None:
        """Homes for every placed key as a function of the key set alone, never of the
        order keys arrived in, so gateway copies that hold the same hot keys agree on
        every home (consistent hashing with bounded loads, keys taken in ascending
        order): each key takes the first replica of its ring order within::

            bound(r) = max(room(r), fair)     fair = all keys' tokens / eligible x (1 + slack)

        or else the least loaded one; with an ``overflow`` set, each key takes the first
        replica within its room alone, then the first overflow replica within its room,
        and only then the fair share. A replica leaving moves its keys and few others.
        Cost: one short ring walk per key (a few ms for 2,000 keys over 64 replicas); a
        pass under way is given up."""
        work = self._pass = self._begin(order_of, eligible, room, overflow)
        work.run(len(self._want))
        self._finish(work)

    def begin_assign(self, order_of: OrderOf, eligible: Collection[str],
                     room: Callable[[str], int], overflow: Overflow | None = None) -> None:
        """The homes ``assign`` gives the set as it is now (and each room as it is now),
        placed ``step`` keys now and ``step`` at each ``advance``; until the last, every
        key keeps its home. A pass under way is given up."""
        self._pass = self._begin(order_of, eligible, room, overflow)
        self.advance()

    def _begin(self, order_of: OrderOf, eligible: Collection[str], room: Callable[[str], int],
               overflow: Overflow | None) -> _Pass:
        return _Pass(self._want, order_of, eligible, room, overflow,
                     self._fair(eligible) if eligible else 0.0)

    def advance(self) -> bool:
        """Places the next ``step`` keys of the pass under way, and its homes replace the
        current ones once all are placed; whether one is still under way."""
        work = self._pass
        if work is None:
            return False
        if not work.run(self.step):
            return True
        self._finish(work)
        return False

    def _finish(self, work: _Pass) -> None:
        """The finished pass's homes in place of the current ones, but for keys placed
        or dropped since it began: they keep what they have now (a first-fit home, or
        none)."""
        keys, loads = work.keys, work.filling.loads
        for key in work.touched:
            placed = keys.pop(key, None)
            if placed is not None:
                _unload(loads, placed)
            kept = self._keys.get(key)
            if kept is not None:
                keys[key] = kept
                loads[kept.replica] = loads.get(kept.replica, 0) + kept.tokens
        self._keys, self._tokens, self._pass = keys, loads, None

    def _fair(self, eligible: Collection[str]) -> float:
        """A fair share of every wanted key's tokens over ``eligible``, with the slack."""
        return sum(self._want.values()) / len(eligible) * (1 + self.slack)

    @staticmethod
    def _first_fit(key: int, tokens: int, order_of: OrderOf, filling: _Filling,
                   fair: float, overflow: Overflow | None = None) -> str:
        """The first replica of ``key``'s ring order within its bound (with an overflow
        set: its room, then the overflow replicas' rooms, then the fair share; the least
        loaded when none is), with ``tokens`` added to its load."""
        loads, room, full = filling.loads, filling.room, filling.full

        def fits(r: str, bound: float) -> bool:
            return loads.get(r, 0) + tokens <= bound

        home = None
        if overflow is not None:
            if filling.homes_open():
                home = next((r for r in order_of(key) if r not in full and fits(r, room(r))),
                            None)
            if home is None and filling.overflow_open():
                home = next((r for r in overflow.order_of(key)
                             if r not in full and fits(r, room(r))), None)
        if home is None:
            home = next((r for r in order_of(key) if fits(r, max(room(r), fair))), None)
        if home is None:
            home = min(order_of(key), key=lambda r: loads.get(r, 0))
        filling.add(home, tokens)
        return home

    def prune(self, still_hot: Callable[[int], bool]) -> int:
        """Forget keys no longer hot; returns how many."""
        gone = [key for key in self._want if not still_hot(key)]
        for key in gone:
            del self._want[key]
            self._touch(key)
            if key in self._keys:
                self._drop(key)
        return len(gone)

    def forget_replica(self, replica: str) -> None:
        """Drops the keys homed on ``replica`` (still wanted: homed again when next
        placed, and at the next ``assign``), and gives up a pass under way: it may home
        keys there."""
        for key in [k for k, p in self._keys.items() if p.replica == replica]:
            self._drop(key)
        self._tokens.pop(replica, None)
        self._pass = None

    def _touch(self, key: int) -> None:
        """Notes that ``key`` was placed or dropped during the pass under way."""
        if self._pass is not None:
            self._pass.touched.add(key)

    def _drop(self, key: int) -> None:
        _unload(self._tokens, self._keys.pop(key))

    def check_integrity(self) -> None:
        tokens: dict[str, int] = {}
        for placed in self._keys.values():
            tokens[placed.replica] = tokens.get(placed.replica, 0) + placed.tokens
        if tokens != self._tokens:
            raise AssertionError(f"placement: totals {self._tokens} != sums by key {tokens}")


def _unload(loads: dict[str, int], placed: Placed) -> None:
    """Takes ``placed``'s tokens off its replica's load (none left: no entry)."""
    left = loads[placed.replica] - placed.tokens
    if left > 0:
        loads[placed.replica] = left
    else:
        del loads[placed.replica]


class _Pass:
    """One assignment of a snapshot of the wanted keys, in ascending key order (popped off
    a heap, so a call sorts no more than it places), with the rooms read once at its start;
    ``touched``: keys that joined or left the set since it began."""

    __slots__ = ("_fair", "_heap", "_order_of", "_overflow", "_tokens", "filling", "keys",
                 "touched")

    def __init__(self, want: dict[int, int], order_of: OrderOf, eligible: Collection[str],
                 room: Callable[[str], int], overflow: Overflow | None, fair: float) -> None:
        self._tokens = dict(want)
        self._heap = list(want) if eligible else []
        heapify(self._heap)
        self._order_of, self._overflow = order_of, overflow
        self._fair = fair
        rooms = _Rooms(room)
        for r in chain(eligible, () if overflow is None else overflow.replicas):
            rooms[r] = room(r)
        self.keys: dict[int, Placed] = {}
        self.filling = _Filling({}, rooms.__getitem__, min(want.values(), default=0),
                                eligible, overflow)
        self.touched: set[int] = set()

    def run(self, n: int) -> bool:
        """Places up to ``n`` more keys; whether every key is placed."""
        heap, tokens, keys, first_fit = self._heap, self._tokens, self.keys, \
            HotPlacement._first_fit
        for _ in range(min(n, len(heap))):
            key = heappop(heap)
            keys[key] = Placed(first_fit(key, tokens[key], self._order_of, self.filling,
                                         self._fair, self._overflow), tokens[key])
        return not heap


class _Rooms(dict[str, int]):
    """Each replica's room, read once (a replica the walk meets that was not listed, at
    its first meeting)."""

    def __init__(self, room: Callable[[str], int]) -> None:
        super().__init__()
        self._room = room

    def __missing__(self, replica: str) -> int:
        self[replica] = value = self._room(replica)
        return value


class _Filling:
    """The loads of one assignment as it goes, and the replicas whose room no wanted key
    fits any more (``least``: the smallest key's tokens), so a key's walk for room skips
    them, and is not started where all are full: with the homes full, an overflowing key
    would otherwise walk every eligible replica (16 ms to assign 512 keys over 64)."""

    __slots__ = ("_eligible", "_full_homes", "_full_overflow", "_overflow", "full", "least",
                 "loads", "room")

    def __init__(self, loads: dict[str, int], room: Callable[[str], int], least: int,
                 eligible: Collection[str], overflow: Overflow | None) -> None:
        self.loads, self.room, self.least = loads, room, least
        self._eligible = eligible
        self._overflow = () if overflow is None else overflow.replicas
        self.full: set[str] = set()
        self._full_homes = self._full_overflow = 0
        for r in list(loads):
            self._check(r)

    def homes_open(self) -> bool:
        return self._full_homes < len(self._eligible)

    def overflow_open(self) -> bool:
        return self._full_overflow < len(self._overflow)

    def add(self, replica: str, tokens: int) -> None:
        self.loads[replica] = self.loads.get(replica, 0) + tokens
        self._check(replica)

    def _check(self, replica: str) -> None:
        if replica in self.full or self.loads[replica] + self.least <= self.room(replica):
            return
        if replica in self._eligible:
            self.full.add(replica)
            self._full_homes += 1
        elif replica in self._overflow:
            self.full.add(replica)
            self._full_overflow += 1
