"""Reference-counted pool of KV blocks with a hash -> block map for prefix caching.

Every block is in exactly one of three states::

    free        ref 0, no hash          in ``_free`` (a stack)
    evictable   ref 0, hash registered  in the eviction queue (policy decides the order)
    in use      ref > 0, hash or not    referenced by one or more requests' block tables

``allocate`` takes free blocks first, then evicts (dropping the victim's hash, so a
recycled block never answers a lookup for its old content). Hits on evictable blocks are
taken out of the queue by ``touch`` before the caller allocates anything else.

The per-block work is written as ``map``/``compress``/dict bulk operations rather than
Python loops: a 6,000-token prompt is 375 blocks, and the offline simulator pushes tens of
thousands of such requests through the pool.

When ``events`` is a list (it is None unless KV events are published), every change to the
set of cached hashes is appended to it as a ``kvwire.kv_event_format`` record: registered blocks as
``BlockStored``, evicted ones as ``BlockRemoved``, a reset as ``AllBlocksCleared``. The
owner of the pool drains the list after each step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress, filterfalse, repeat
from operator import add, not_, sub

from engine.eviction import EvictionPolicy, drain, make_eviction
from kvwire.block_hashing import BlockHash, hash_to_u64
from kvwire.kv_event_format import AllBlocksCleared, BlockRemoved, KVEvent, stored_runs


class BlockPool:
    def __init__(self, num_blocks: int, eviction: str | EvictionPolicy = "lru") -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref: list[int] = [0] * num_blocks
        # block id -> hash, for registered blocks only; ``cached`` is its inverse.
        self.block_hash: dict[int, BlockHash] = {}
        self.cached: dict[BlockHash, int] = {}
        # Popped from the end: block 0 is handed out first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.evictor: EvictionPolicy = (
            make_eviction(eviction, num_blocks) if isinstance(eviction, str) else eviction
        )
        self.num_evictions = 0
        self.events: list[KVEvent] | None = None
        # in-use blocks holding a hash another block registered first (two requests
        # computed one prefix in the same step), by hash and by block: when the registered
        # one is evicted, one of them takes the hash over (see ``allocate``)
        self._dups: dict[BlockHash, set[int]] = {}
        self._dup_of: dict[int, BlockHash] = {}

    # -- queries -----------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: free plus evictable."""
        return len(self._free) + len(self.evictor)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free) - len(self.evictor)

    @property
    def num_evictable_blocks(self) -> int:
        return len(self.evictor)

    def usage(self) -> float:
        """Fraction of blocks in use (0-1), as vLLM's ``kv_cache_usage_perc``."""
        return self.num_used_blocks / self.num_blocks

    def longest_cached_prefix(self, hashes: Sequence[BlockHash], max_blocks: int) -> list[int]:
        """Block ids of the longest run ``hashes[0:k]`` (k <= max_blocks) all cached."""
        limit = len(range(len(hashes))[:max_blocks])
        get = self.cached.get
        out: list[int] = []
        # Probe in chunks of growing size: a miss at block 0 costs one lookup, a long
        # hit a handful of C-level passes.
        lo, step = 0, 8
        while lo < limit:
            hi = min(lo + step, limit)
            found = list(map(get, hashes[lo:hi]))
            if None in found:
                out += found[: found.index(None)]  # type: ignore[operator,arg-type]
                return out
            out += found  # type: ignore[arg-type]
            lo, step = hi, step * 4
        return out

    def num_unreferenced(self, block_ids: Sequence[int]) -> int:
        """How many of ``block_ids`` have ref 0 (cached hits still in the queue)."""
        return list(map(self.ref.__getitem__, block_ids)).count(0)

    # -- mutations ---------------------------------------------------------------------

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cached blocks (prefix hits); evictable ones leave the queue."""
        ref = self.ref
        refs = list(map(ref.__getitem__, block_ids))
        if 0 in refs:
            self.evictor.remove_many(list(compress(block_ids, map(not_, refs))))
        drain(map(ref.__setitem__, block_ids, map(add, refs, repeat(1))))

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with ref 1 and no hash. ValueError (nothing changed) if short."""
        free = self._free
        if n > len(free) + len(self.evictor):
            raise ValueError(f"cannot allocate {n} blocks: {self.num_free_blocks} available")
        if n <= len(free):
            out = free[len(free) - n :]
            del free[len(free) - n :]
            out.reverse()
        else:
            out = free[::-1]
            free.clear()
            victims = self.evictor.pop_victims(n - len(out))
            # Drop each victim's hash from both maps.
            dropped = list(map(self.block_hash.pop, victims))
            drain(map(self.cached.__delitem__, dropped))
            if self._dups:
                dropped = [h for h in dropped if not self._take_over(h)]
            if self.events is not None and dropped:
                self.events.append(BlockRemoved(tuple(map(hash_to_u64, dropped))))
            self.num_evictions += len(victims)
            out += victims
        drain(map(self.ref.__setitem__, out, repeat(1)))
        return out

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block (distinct ids), in the given order. Blocks
        reaching ref 0 go to the eviction queue if cached, else to the free stack. Callers
        pass a request's table tail-first so its last blocks are evicted first."""
        ids = list(block_ids)
        ref = self.ref
        refs = list(map(sub, map(ref.__getitem__, ids), repeat(1)))
        drain(map(ref.__setitem__, ids, refs))
        if 0 not in refs:
            return
        zero = list(compress(ids, map(not_, refs))) if any(refs) else ids
        bh = self.block_hash
        hashed = list(filter(bh.__contains__, zero))
        if len(hashed) != len(zero):
            unhashed = list(filterfalse(bh.__contains__, zero))
            if self._dup_of:
                for b in unhashed:
                    self._drop_dup(b)
            self._free.extend(unhashed)
        if hashed:
            self.evictor.push_many(hashed, list(map(bh.__getitem__, hashed)))

    def cache_blocks(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[BlockHash],
        tokens: Sequence[int] = (),
        parent: BlockHash | None = None,
        adapter: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        """Register in-use, computed blocks under their hashes; returns how many were newly
        registered. A block whose hash another block already holds (two requests computed
        the same prefix in the same step) stays uncached, remembered as a duplicate: it
        takes the hash over if the other is evicted first. ``tokens`` (the blocks' token
        ids, concatenated), ``parent`` (the hash before ``hashes[0]``), ``adapter`` and
        ``cache_salt`` (the chain's, which hashes[0] was salted with when it has no
        ``parent``) are only used to record events."""
        cached, bh = self.cached, self.block_hash
        new = dict(zip(hashes, block_ids, strict=True))
        if len(new) == len(block_ids) and cached.keys().isdisjoint(new) and bh.keys().isdisjoint(
            block_ids
        ):
            cached.update(new)
            bh.update(zip(block_ids, hashes, strict=True))
            if self._dup_of:  # any registered now under a hash of its own
                for b in block_ids:
                    self._drop_dup(b)
            if self.events is not None:
                self._record_stored(hashes, [True] * len(hashes), tokens, parent, adapter,
                                    cache_salt)
            return len(new)
        fresh: list[bool] = []
        for b, h in zip(block_ids, hashes, strict=True):
            ok = b not in bh and h not in cached
            if ok:
                cached[h] = b
                bh[b] = h
                if b in self._dup_of:  # registered now under a hash of its own
                    self._drop_dup(b)
            elif b not in bh and cached[h] != b and b not in self._dup_of:
                self._dups.setdefault(h, set()).add(b)
                self._dup_of[b] = h
            fresh.append(ok)
        if self.events is not None:
            self._record_stored(hashes, fresh, tokens, parent, adapter, cache_salt)
        return fresh.count(True)

    def _record_stored(self, hashes: Sequence[BlockHash], fresh: Sequence[bool],
                       tokens: Sequence[int], parent: BlockHash | None,
                       adapter: str | None, cache_salt: str | None) -> None:
        assert self.events is not None
        if not hashes or len(tokens) % len(hashes):
            raise ValueError(f"{len(tokens)} tokens do not fill {len(hashes)} blocks")
        self.events.extend(stored_runs(
            list(map(hash_to_u64, hashes)), fresh, tokens,
            None if parent is None else hash_to_u64(parent), len(tokens) // len(hashes),
            adapter, cache_salt))

    def _take_over(self, h: BlockHash) -> bool:
        """``h``'s registered block was evicted: an in-use block holding the same content
        takes the hash over (so the blocks chained after it stay reachable and their
        events' parent stays stored); whether one did."""
        held = self._dups.pop(h, None)
        if not held:
            return False
        b = held.pop()
        del self._dup_of[b]
        if held:
            self._dups[h] = held
        self.cached[h] = b
        self.block_hash[b] = h
        return True

    def _drop_dup(self, b: int) -> None:
        h = self._dup_of.pop(b, None)
        if h is not None:
            held = self._dups[h]
            held.discard(b)
            if not held:
                del self._dups[h]

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash. Evictable blocks become free; in-use blocks stay in
        use but uncached. Returns how many hashes were dropped."""
        n = len(self.cached)
        self._free.extend(self.evictor.clear())
        self.block_hash.clear()
        self.cached.clear()
        self._dups.clear()
        self._dup_of.clear()
        if self.events is not None:
            self.events.append(AllBlocksCleared())
        return n

    # -- checks ------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Raise AssertionError if the pool's books disagree."""
        n_free, n_evict = len(self._free), len(self.evictor)
        n_used = sum(1 for r in self.ref if r > 0)
        if n_free + n_evict + n_used != self.num_blocks:
            raise AssertionError(
                f"free {n_free} + evictable {n_evict} + in use {n_used} "
                f"!= total {self.num_blocks}"
            )
        if any(r < 0 for r in self.ref):
            raise AssertionError("negative reference count")
        free_set = set(self._free)
        if len(free_set) != n_free:
            raise AssertionError("block listed twice in the free stack")
        bh = self.block_hash
        for b in free_set:
            if self.ref[b] != 0 or b in bh:
                raise AssertionError(f"free block {b} has ref {self.ref[b]} or a hash")
        for b in range(self.num_blocks):
            in_q = b in self.evictor
            if in_q and (self.ref[b] != 0 or b not in bh or b in free_set):
                raise AssertionError(f"queued block {b} is in use, uncached or free")
            if self.ref[b] == 0 and not in_q and b not in free_set:
                raise AssertionError(f"block {b} has ref 0 but is neither free nor queued")
        if len(bh) != len(self.cached):
            raise AssertionError(f"{len(bh)} hashed blocks but {len(self.cached)} map entries")
        for h, b in self.cached.items():
            if bh.get(b) != h:
                raise AssertionError(f"hash map points to block {b} which holds another hash")
        for b, h in self._dup_of.items():
            if self.ref[b] == 0 or b in bh or b not in self._dups.get(h, ()) \
                    or h not in self.cached:
                raise AssertionError(f"duplicate block {b} is free, hashed, or of no cached hash")
