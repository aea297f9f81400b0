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

from collections import OrderedDict
from collections.abc import Iterable
from typing import Protocol

from engine.hashing import BlockHash


class EvictionPolicy(Protocol):
    name: str

    def push(self, block_id: int, block_hash: BlockHash) -> None:
        """A cached block became free. Must not already be queued."""
        ...

    def remove(self, block_id: int) -> None:
        """A queued block was hit and is in use again. KeyError if not queued."""
        ...

    def pop_victim(self) -> int:
        """Remove and return the block to evict next. IndexError if empty."""
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
        self._queue: OrderedDict[int, None] = OrderedDict()

    def push(self, block_id: int, block_hash: BlockHash) -> None:
        self._queue[block_id] = None

    def remove(self, block_id: int) -> None:
        del self._queue[block_id]

    def pop_victim(self) -> int:
        if not self._queue:
            raise IndexError("eviction queue is empty")
        return self._queue.popitem(last=False)[0]

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
        self._counts: dict[BlockHash, int] = {}
        self._uses_since_decay = 0
        self._probation: OrderedDict[int, None] = OrderedDict()
        self._protected: OrderedDict[int, None] = OrderedDict()

    def count(self, block_hash: BlockHash) -> int:
        return self._counts.get(block_hash, 0)

    def record_uses(self, block_hashes: Iterable[BlockHash]) -> None:
        counts = self._counts
        get = counts.get
        n = 0
        for h in block_hashes:
            counts[h] = get(h, 0) + 1
            n += 1
        self._uses_since_decay += n
        if self._uses_since_decay >= self.decay_period:
            self._uses_since_decay = 0
            self._counts = {h: c >> 1 for h, c in counts.items() if c > 1}

    def push(self, block_id: int, block_hash: BlockHash) -> None:
        if self._counts.get(block_hash, 0) >= self.min_count:
            prot = self._protected
            prot[block_id] = None
            if len(prot) > self.protected_cap:
                demoted = prot.popitem(last=False)[0]
                self._probation[demoted] = None
        else:
            self._probation[block_id] = None

    def remove(self, block_id: int) -> None:
        if self._probation.pop(block_id, 1) is not None:
            del self._protected[block_id]

    def pop_victim(self) -> int:
        if self._probation:
            return self._probation.popitem(last=False)[0]
        if self._protected:
            return self._protected.popitem(last=False)[0]
        raise IndexError("eviction queue is empty")

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


def make_eviction(name: str, num_blocks: int) -> LRUEviction | FrequencyEviction:
    if name == "lru":
        return LRUEviction()
    if name == "frequency":
        return FrequencyEviction(num_blocks)
    raise ValueError(f"unknown eviction policy {name!r}; expected 'lru' or 'frequency'")
