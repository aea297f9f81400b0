"""Reference-counted pool of KV blocks with a hash -> block map for prefix caching.

Every block is in exactly one of three states::

    free        ref 0, no hash          in ``_free`` (a stack)
    evictable   ref 0, hash registered  in the eviction queue (policy decides the order)
    in use      ref > 0, hash or not    referenced by one or more requests' block tables

``allocate`` takes free blocks first, then evicts (dropping the victim's hash, so a
recycled block never answers a lookup for its old content). Hits on evictable blocks are
taken out of the queue by ``touch`` before the caller allocates anything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.eviction import EvictionPolicy, make_eviction
from engine.hashing import BlockHash


class BlockPool:
    def __init__(self, num_blocks: int, eviction: str | EvictionPolicy = "lru") -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref: list[int] = [0] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.cached: dict[BlockHash, int] = {}
        # Popped from the end: block 0 is handed out first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.evictor: EvictionPolicy = (
            make_eviction(eviction, num_blocks) if isinstance(eviction, str) else eviction
        )
        self.num_evictions = 0

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
        get = self.cached.get
        out: list[int] = []
        append = out.append
        for i in range(min(max_blocks, len(hashes))):
            b = get(hashes[i])
            if b is None:
                break
            append(b)
        return out

    # -- mutations ---------------------------------------------------------------------

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on cached blocks (prefix hits); evictable ones leave the queue."""
        ref = self.ref
        remove = self.evictor.remove
        for b in block_ids:
            if ref[b] == 0:
                remove(b)
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks with ref 1 and no hash. ValueError (nothing changed) if short."""
        free = self._free
        if n > len(free) + len(self.evictor):
            raise ValueError(f"cannot allocate {n} blocks: {self.num_free_blocks} available")
        ref = self.ref
        if n <= len(free):
            out = free[len(free) - n :]
            del free[len(free) - n :]
            out.reverse()
        else:
            out = free[::-1]
            free.clear()
            pop_victim = self.evictor.pop_victim
            bh = self.block_hash
            cached = self.cached
            n_evict = n - len(out)
            for _ in range(n_evict):
                b = pop_victim()
                del cached[bh[b]]  # type: ignore[arg-type]  # queued blocks are hashed
                bh[b] = None
                out.append(b)
            self.num_evictions += n_evict
        for b in out:
            ref[b] = 1
        return out

    def free_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop one reference from each block, in the given order. Blocks reaching ref 0
        go to the eviction queue if cached, else to the free stack. Callers pass a
        request's table tail-first so its last blocks are evicted first."""
        ref = self.ref
        bh = self.block_hash
        push = self.evictor.push
        free_append = self._free.append
        for b in block_ids:
            r = ref[b] - 1
            ref[b] = r
            if r == 0:
                h = bh[b]
                if h is None:
                    free_append(b)
                else:
                    push(b, h)

    def cache_block(self, block_id: int, block_hash: BlockHash) -> bool:
        """Register an in-use, computed block under ``block_hash``. Returns False (and
        leaves the block uncached) if another block already holds that hash, which
        happens when two requests computed the same prefix in the same step."""
        if self.block_hash[block_id] is not None:
            return self.block_hash[block_id] == block_hash
        if block_hash in self.cached:
            return False
        self.cached[block_hash] = block_id
        self.block_hash[block_id] = block_hash
        return True

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash. Evictable blocks become free; in-use blocks stay in
        use but uncached. Returns how many hashes were dropped."""
        n = len(self.cached)
        for b in self.evictor.clear():
            self._free.append(b)
        bh = self.block_hash
        for i in range(self.num_blocks):
            bh[i] = None
        self.cached.clear()
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
        for b in free_set:
            if self.ref[b] != 0 or self.block_hash[b] is not None:
                raise AssertionError(f"free block {b} has ref {self.ref[b]} or a hash")
        for b in range(self.num_blocks):
            in_q = b in self.evictor
            if in_q and (self.ref[b] != 0 or self.block_hash[b] is None or b in free_set):
                raise AssertionError(f"queued block {b} is in use, uncached or free")
            if self.ref[b] == 0 and not in_q and b not in free_set:
                raise AssertionError(f"block {b} has ref 0 but is neither free nor queued")
        for h, b in self.cached.items():
            if self.block_hash[b] != h:
                raise AssertionError(f"hash map points to block {b} which holds another hash")
        n_hashed = sum(1 for h in self.block_hash if h is not None)
        if n_hashed != len(self.cached):
            raise AssertionError(f"{n_hashed} hashed blocks but {len(self.cached)} map entries")
