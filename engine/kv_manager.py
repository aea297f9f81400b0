"""Per-request KV block management on top of the block pool: prefix lookup, slot
allocation, registering computed blocks in the cache, freeing.

A request's block table covers its KV positions::

    block_table[i] holds positions [i * B, (i + 1) * B)
    [0, num_cached_blocks)            registered in the prefix cache (or a duplicate)
    [0, num_computed_tokens // B)     full blocks whose KV exists
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.block_pool import BlockPool
from engine.eviction import EvictionPolicy
from engine.request import Request


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int, eviction: str | EvictionPolicy = "lru"
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, eviction)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def lookup(self, req: Request) -> list[int]:
        """Block ids of the longest cached prefix of ``req``'s known tokens. The hit never
        covers the last token (its logits must be computed), so at most
        ``(num_tokens - 1) // B`` blocks. A request asking for its prompt's log
        probabilities finds nothing: cached positions have no logits (as vLLM V1, which
        skips reading the prefix cache for it; its blocks are still cached when computed).
        Takes no references."""
        if not self.reads_prefix_cache(req):
            return []
        max_blocks = (len(req.all_token_ids) - 1) // self.block_size
        return self.pool.longest_cached_prefix(req.block_hashes, max_blocks)

    @staticmethod
    def reads_prefix_cache(req: Request) -> bool:
        """Whether :meth:`lookup` looks ``req`` up at all: not for a request asking for
        its prompt's log probabilities (vLLM's ``skip_reading_prefix_cache``), which the
        prefix-cache counters leave out, as vLLM's do."""
        return req.params.prompt_logprobs is None

    def allocate(
        self, req: Request, num_new_tokens: int, hit_blocks: Sequence[int] = ()
    ) -> bool:
        """Make room for ``num_new_tokens`` more tokens after the computed ones.

        ``hit_blocks`` (from :meth:`lookup`, only for a request with an empty table) are
        referenced first, which takes them out of the eviction queue before any block is
        allocated, and the request's computed count advances over them. Returns False and
        changes nothing if the pool is short.
        """
        bs = self.block_size
        table = req.block_table
        n_hit = len(hit_blocks)
        total = req.num_computed_tokens + n_hit * bs + num_new_tokens
        need = -(-total // bs) - len(table) - n_hit
        pool = self.pool
        if need > 0:
            avail = pool.num_free_blocks
            if n_hit:
                avail -= pool.num_unreferenced(hit_blocks)
            if need > avail:
                return False
        if n_hit:
            if table:
                raise ValueError(f"prefix hits for {req.request_id} with a non-empty table")
            pool.touch(hit_blocks)
            table.extend(hit_blocks)
            req.num_computed_tokens += n_hit * bs
            req.num_cached_blocks = n_hit
            self._record_uses(req, n_hit)
        if need > 0:
            table.extend(pool.allocate(need))
        return True

    def cache_computed(self, req: Request) -> None:
        """Register the request's full, computed blocks that have hashes."""
        n = min(req.num_computed_tokens // self.block_size, len(req.block_hashes))
        start = req.num_cached_blocks
        if n <= start:
            return
        new_hashes = req.block_hashes[start:n]
        if self.pool.events is None:
            self.pool.cache_blocks(req.block_table[start:n], new_hashes)
        else:  # blocks [start, n) hold tokens [start * B, n * B)
            bs = self.block_size
            parent = req.block_hashes[start - 1] if start else None
            self.pool.cache_blocks(req.block_table[start:n], new_hashes,
                                   req.all_token_ids[start * bs : n * bs], parent, req.adapter,
                                   req.cache_salt)
        self._record_uses(req, n)
        req.num_cached_blocks = n

    def _record_uses(self, req: Request, n: int) -> None:
        """Tell the eviction policy ``req`` used its blocks ``[0, n)``, each once per
        request: a preempted request hitting or computing its own blocks again (or a
        running one caching them again after a reset) is not another use of them."""
        done = req.num_recorded_blocks
        if n > done:
            self.pool.evictor.record_uses(req.block_hashes[done:n])
            req.num_recorded_blocks = n

    def free(self, req: Request) -> None:
        """Release the request's blocks, last block first (so it is evicted first)."""
        table = req.block_table
        self.pool.free_blocks(reversed(table))
        table.clear()
        req.num_cached_blocks = 0

    def usage(self) -> float:
        return self.pool.usage()

    def reset_prefix_cache(self) -> int:
        return self.pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        self.pool.check_integrity()
