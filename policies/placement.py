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
new key is placed then, first fit), and whenever the owner calls ``assign`` (``cost``: at
each sketch window, after ``prune``). A replica leaving moves its own keys and few others.

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import NamedTuple

# up to this many placed keys, a key joining reassigns the whole set at once (about 1.5 ms
# at 512 keys over 64 replicas); past it, the whole set waits for the next ``assign``
REASSIGN_ON_JOIN = 512
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

    __slots__ = ("_keys", "_tokens", "_want", "limit", "slack")

    def __init__(self, slack: float = 0.05, limit: int = 8192) -> None:
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack!r}")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.slack = slack
        self.limit = limit
        self._keys: dict[int, Placed] = {}  # each wanted key's home
        self._tokens: dict[str, int] = {}
        self._want: dict[int, int] = {}  # key -> its tokens, oldest first

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
            if oldest in self._keys:
                self._drop(oldest)
        self._want[key] = tokens
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
        Cost: one short ring walk per key (a few ms for 2,000 keys over 64 replicas)."""
        keys: dict[int, Placed] = {}
        loads: dict[str, int] = {}
        if eligible:
            fair = self._fair(eligible)
            filling = _Filling(loads, room, min(self._want.values(), default=0), eligible,
                               overflow)
            for key, tokens in sorted(self._want.items()):
                keys[key] = Placed(self._first_fit(key, tokens, order_of, filling, fair,
                                                   overflow), tokens)
        self._keys, self._tokens = keys, loads

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
            if key in self._keys:
                self._drop(key)
        return len(gone)

    def forget_replica(self, replica: str) -> None:
        for key in [k for k, p in self._keys.items() if p.replica == replica]:
            self._drop(key)  # still wanted: homed again at the next ``assign``
        self._tokens.pop(replica, None)

    def _drop(self, key: int) -> None:
        placed = self._keys.pop(key)
        left = self._tokens[placed.replica] - placed.tokens
        if left > 0:
            self._tokens[placed.replica] = left
        else:
            del self._tokens[placed.replica]

    def check_integrity(self) -> None:
        tokens: dict[str, int] = {}
        for placed in self._keys.values():
            tokens[placed.replica] = tokens.get(placed.replica, 0) + placed.tokens
        if tokens != self._tokens:
            raise AssertionError(f"placement: totals {self._tokens} != sums by key {tokens}")


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
