"""Eviction queues for freed blocks that still hold cached KV.

A block enters the queue (``push``) when its reference count drops to zero while its hash
is registered; it leaves either because a request hits it (``remove``) or because the pool
needs a block (``pop_victim``). Policies:

- ``lru``: evict the block freed longest ago (vLLM's behaviour; a request's blocks are
  pushed tail-first so its last blocks go first).
- ``frequency``: a segmented LRU with frequency admission, in the spirit of TinyLFU.
  Every use of a block hash (hit or fresh computation) bumps a count; all counts are
  halved every ``decay_period`` uses, so old popularity fades. A freed block whose count is
  at least ``min_count`` goes to a *protected* LRU, others to a *probation* LRU. Victims
  come from probation first, so one-off prefixes churn among themselves instead of
  evicting prefixes that are reused. Protected is capped at ``protected_fraction`` of the
  pool; its overflow is demoted to the young end of probation.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator
from itertools import compress, islice, repeat
from operator import not_
from typing import Any, Protocol

from kvwire.block_hashing import BlockHash


class EvictionPolicy(Protocol):
    name: str

    def push(self, block_id: int, block_hash: BlockHash) -> None:
        """A cached block became free. Must not already be queued."""
        ...

    def push_many(self, block_ids: list[int], block_hashes: list[BlockHash]) -> None:
        """``push`` each pair in order (the first pushed is evicted first among them)."""
        ...

    def remove(self, block_id: int) -> None:
        """A queued block was hit and is in use again. KeyError if not queued."""
        ...

    def remove_many(self, block_ids: list[int]) -> None:
        """``remove`` each block."""
        ...

    def pop_victim(self) -> int:
        """Remove and return the block to evict next. IndexError if empty."""
        ...

    def pop_victims(self, n: int) -> list[int]:
        """``pop_victim`` ``n`` times. The caller checks ``n <= len(self)``."""
        ...

    def record_uses(self, block_hashes: Iterable[BlockHash]) -> None:
        """Requests used these hashes (hits or newly computed blocks)."""
        ...

    def clear(self) -> list[int]:
        """Empty the queue; returns the blocks that were in it."""
        ...

    def __len__(self) -> int: ...

    def __contains__(self, block_id: object) -> bool: ...


class LRUEviction:
    name = "lru"

    def __init__(self) -> None:
        # A plain dict in insertion order: the first key is the next victim.
        self._queue: dict[int, None] = {}

    def push(self, block_id: int, block_hash: BlockHash) -> None:
        self._queue[block_id] = None

    def push_many(self, block_ids: list[int], block_hashes: list[BlockHash]) -> None:
        self._queue.update(zip(block_ids, repeat(None)))

    def remove(self, block_id: int) -> None:
        del self._queue[block_id]

    def remove_many(self, block_ids: list[int]) -> None:
        drain(map(self._queue.pop, block_ids))

    def pop_victim(self) -> int:
        if not self._queue:
            raise IndexError("eviction queue is empty")
        return self.pop_victims(1)[0]

    def pop_victims(self, n: int) -> list[int]:
        return _pop_front(self._queue, n)

    def record_uses(self, block_hashes: Iterable[BlockHash]) -> None:
        return None

    def clear(self) -> list[int]:
        out = list(self._queue)
        self._queue.clear()
        return out

    def order(self) -> list[int]:
        """Blocks in eviction order (next victim first)."""
        return list(self._queue)

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._queue


class FrequencyEviction:
    name = "frequency"

    def __init__(
        self,
        num_blocks: int,
        *,
        min_count: int = 2,
        protected_fraction: float = 0.8,
        decay_period: int | None = None,
    ) -> None:
        if min_count < 1:
            raise ValueError(f"min_count must be >= 1, got {min_count}")
        if not 0.0 <= protected_fraction <= 1.0:
            raise ValueError(f"protected_fraction must be in [0, 1], got {protected_fraction}")
        self.min_count = min_count
        self.protected_cap = int(num_blocks * protected_fraction)
        self.decay_period = decay_period if decay_period is not None else 10 * num_blocks
        if self.decay_period < 1:
            raise ValueError(f"decay_period must be >= 1, got {self.decay_period}")
        self._counts: Counter[BlockHash] = Counter()
        self._uses_since_decay = 0
        # Insertion-ordered dicts, oldest first, as in LRUEviction.
        self._probation: dict[int, None] = {}
        self._protected: dict[int, BlockHash] = {}  # block id -> its hash

    def count(self, block_hash: BlockHash) -> int:
        return self._counts.get(block_hash, 0)

    def record_uses(self, block_hashes: Iterable[BlockHash]) -> None:
        hashes = block_hashes if isinstance(block_hashes, list) else list(block_hashes)
        self._counts.update(hashes)  # Counter.update counts in C
        self._uses_since_decay += len(hashes)
        if self._uses_since_decay >= self.decay_period:
            self._uses_since_decay = 0
            self._counts = Counter({h: c >> 1 for h, c in self._counts.items() if c > 1})

    def push(self, block_id: int, block_hash: BlockHash) -> None:
        self.push_many([block_id], [block_hash])

    def push_many(self, block_ids: list[int], block_hashes: list[BlockHash]) -> None:
        counts = self._counts
        freq = list(map(counts.get, block_hashes, repeat(0)))
        hot = list(map(self.min_count.__le__, freq))  # hot[i]: freq[i] >= min_count
        prob, prot = self._probation, self._protected
        if True not in hot:
            prob.update(zip(block_ids, repeat(None)))
            return
        hot_hashes = list(compress(block_hashes, hot))
        excess = len(prot) + len(hot_hashes) - self.protected_cap
        if excess > 0 and prot:
            # Admission: the newcomers displace protected blocks only when they are used at
            # least as often (mean count) as the oldest protected blocks they would demote.
            victims = list(islice(prot.values(), min(excess, len(prot))))
            victim_uses = sum(map(counts.get, victims, repeat(0)))
            if sum(compress(freq, hot)) * len(victims) < victim_uses * len(hot_hashes):
                prob.update(zip(block_ids, repeat(None)))
                return
        # Pushing the hot blocks one at a time, each followed by demoting protected's
        # oldest while over the cap, demotes the first ``excess`` of (old protected + hot
        # blocks) in order, before any cold block reaches probation.
        prot.update(zip(compress(block_ids, hot), hot_hashes, strict=True))
        excess = len(prot) - self.protected_cap
        if excess > 0:
            prob.update(zip(_pop_front(prot, excess), repeat(None)))
        prob.update(zip(compress(block_ids, map(not_, hot)), repeat(None)))

    def remove_many(self, block_ids: list[int]) -> None:
        # pop's default (1) marks the blocks that were not in probation.
        missing = list(map(self._probation.pop, block_ids, repeat(1)))
        if 1 in missing:
            drain(map(self._protected.pop, compress(block_ids, missing)))

    def remove(self, block_id: int) -> None:
        self.remove_many([block_id])

    def pop_victim(self) -> int:
        return self.pop_victims(1)[0]

    def pop_victims(self, n: int) -> list[int]:
        if n > len(self):
            raise IndexError(f"eviction queue holds {len(self)} blocks, {n} requested")
        victims = _pop_front(self._probation, n)
        if len(victims) < n:
            victims += _pop_front(self._protected, n - len(victims))
        return victims

    def clear(self) -> list[int]:
        out = [*self._probation, *self._protected]
        self._probation.clear()
        self._protected.clear()
        return out

    def order(self) -> list[int]:
        """Blocks in eviction order (next victim first)."""
        return [*self._probation, *self._protected]

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._probation or block_id in self._protected


def _pop_front(queue: dict[int, Any], n: int) -> list[int]:
    """Remove and return the (up to) ``n`` oldest keys of an insertion-ordered dict."""
    out = list(islice(queue, n))
    drain(map(queue.pop, out))
    return out


def drain(it: Iterator[object]) -> None:
    """Run an iterator of side effects to exhaustion in C, keeping nothing."""
    deque(it, maxlen=0)


EVICTION_POLICIES = ("lru", "frequency")


def check_eviction_name(name: str) -> str:
    """``name`` if it names an eviction policy; ValueError naming the choices if not."""
    if name not in EVICTION_POLICIES:
        raise ValueError(f"unknown eviction policy {name!r}; expected 'lru' or 'frequency'")
    return name


def make_eviction(name: str, num_blocks: int) -> LRUEviction | FrequencyEviction:
    if check_eviction_name(name) == "lru":
        return LRUEviction()
    return FrequencyEviction(num_blocks)
