"""Homes for hot prefix keys: ring order, with bounded load per replica.

Ring hashing alone gives replicas an uneven share of the hot set (with 50 hot documents
over 6 replicas, 4 on one and 11 on another): in front of an LRU cache that holds 8, the
replica with 11 thrashes while the one with 4 wastes room. ``HotPlacement`` walks the ring
from the key, as consistent hashing does, but passes over a replica once the hot keys
already placed there would exceed its bound (consistent hashing with bounded loads)::

    bound(r) = max(room(r), fair x (1 + slack))      in tokens
    room(r)  = the tokens the replica's cache holds (the caller's estimate)
    fair     = (tokens placed + this key's) / eligible replicas

so caches fill before any overflows, and overflow is shared evenly. A key keeps its home
while it stays hot and its home stays eligible: the walk is taken only when a key turns hot
or loses its home, or when ``rebalance`` unplaced it from a replica past its bound. Two
gateway copies that see the same hot keys in the same order place them the same; ordering
differences move only keys near a bound.

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple


class Placed(NamedTuple):
    replica: str
    tokens: int


class HotPlacement:
    """Bounded-load homes for hot keys; see the module docstring."""

    __slots__ = ("_keys", "_tokens", "limit", "slack")

    def __init__(self, slack: float = 0.05, limit: int = 8192) -> None:
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack!r}")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        self.slack = slack
        self.limit = limit
        self._keys: dict[int, Placed] = {}  # oldest placement first
        self._tokens: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def home_of(self, key: int) -> str | None:
        placed = self._keys.get(key)
        return None if placed is None else placed.replica

    def tokens_on(self, replica: str) -> int:
        """Tokens of the hot keys placed on ``replica``."""
        return self._tokens.get(replica, 0)

    def place(self, key: int, tokens: int, ring_order: Iterable[str],
              room: Callable[[str], int]) -> str | None:
        """The home of ``key``: its current one if it is in ``ring_order`` (the eligible
        replicas in ring order from the key), else the first there within its bound (the
        one with the fewest placed tokens when none is). ``None`` when nothing is
        eligible."""
        order = list(ring_order)
        if not order:
            return None
        placed = self._keys.get(key)
        if placed is not None:
            if placed.replica in order:
                return placed.replica
            self._drop(key)
        loads = self._tokens
        fair = self._fair(order, tokens)
        home = next((r for r in order if loads.get(r, 0) + tokens <= max(room(r), fair)),
                    None)
        if home is None:
            home = min(order, key=lambda r: loads.get(r, 0))  # first in ring order on ties
        if len(self._keys) >= self.limit:
            self._drop(next(iter(self._keys)))
        self._keys[key] = Placed(home, tokens)
        loads[home] = loads.get(home, 0) + tokens
        return home

    def rebalance(self, eligible: list[str], room: Callable[[str], int]) -> int:
        """Unplace the newest keys of replicas past their bounds (a replica that joined, or
        left the scratch set, would otherwise stay empty while others overflow); they are
        placed again on their next request. Returns how many were unplaced."""
        if not eligible:
            return 0
        fair = self._fair(eligible, 0)
        loads = self._tokens
        over = {r for r in eligible if loads.get(r, 0) > max(room(r), fair)}
        moved = 0
        for key in reversed(list(self._keys)):
            if not over:
                break
            rid = self._keys[key].replica
            if rid in over:
                self._drop(key)
                moved += 1
                if loads.get(rid, 0) <= max(room(rid), fair):
                    over.discard(rid)
        return moved

    def prune(self, still_hot: Callable[[int], bool]) -> int:
        """Forget keys no longer hot; returns how many."""
        gone = [key for key in self._keys if not still_hot(key)]
        for key in gone:
            self._drop(key)
        return len(gone)

    def forget_replica(self, replica: str) -> None:
        for key in [k for k, p in self._keys.items() if p.replica == replica]:
            self._drop(key)
        self._tokens.pop(replica, None)

    def _fair(self, order: list[str], extra: int) -> float:
        total = sum(self._tokens.get(r, 0) for r in order) + extra
        return total / len(order) * (1 + self.slack)

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
