"""Block hashes of workload prompts, memoized along shared segments.

The engine's hash chain (``kvwire.block_hashing``) has the property

    block_hashes(a + b) == block_hashes(a) + block_hashes(b, parent=last hash of a)

whenever ``len(a)`` is a multiple of the block size. A prompt made of shared segments
(system prompt, document, earlier turns) followed by a one-off question therefore reuses
the hashes of its shared part, cut at a block boundary, and hashes only the rest::

    prompt:   [0, shared_len) shared segments | [shared_len, len) one-off tail
    memo:     [0, aligned)  aligned = shared_len // B * B   (looked up, not recomputed)
    hashed:   [aligned, len // B * B)                        (chained from the memo)

The result is exactly what ``kvwire.block_hashing.block_hashes`` gives for the whole prompt.
"""

from __future__ import annotations

from collections import OrderedDict

from kvwire.block_hashing import BlockHash, block_hashes
from loadtests.workloads import WorkloadRequest


class PrefixHashes:
    """Hashes of a request's full prompt blocks, as the engine would compute them."""

    def __init__(self, block_size: int, model_id: str, *, capacity: int = 8192) -> None:
        self.block_size = block_size
        self.model_id = model_id
        self.capacity = capacity
        # (segment keys of a shared prefix) -> hashes of its full blocks
        self._memo: OrderedDict[tuple[str, ...], list[BlockHash]] = OrderedDict()

    def _shared_prefix(self, request: WorkloadRequest) -> tuple[str, ...]:
        return tuple(seg.key for seg in request.shared_segments())

    def _lookup(self, keys: tuple[str, ...]) -> tuple[int, list[BlockHash]]:
        """Longest memoized leading run of ``keys``: (its segment count, its hashes)."""
        for n in range(len(keys), 0, -1):
            hit = self._memo.get(keys[:n])
            if hit is not None:
                self._memo.move_to_end(keys[:n])
                return n, hit
        return 0, []

    def shared_hashes(self, request: WorkloadRequest, token_ids: list[int],
                      shared_len: int | None = None) -> list[BlockHash]:
        """Hashes of the full blocks inside the request's shared leading segments, which
        take ``shared_len`` of ``token_ids`` (default: the segments' lengths)."""
        keys = self._shared_prefix(request)
        if not keys:
            return []
        done, hashes = self._lookup(keys)
        if done < len(keys):
            if shared_len is None:
                shared_len = sum(s.length for s in request.segments[: len(keys)])
            start = len(hashes) * self.block_size
            end = shared_len // self.block_size * self.block_size
            parent = hashes[-1] if hashes else None
            hashes = hashes + block_hashes(token_ids[start:end], self.block_size,
                                           model_id=self.model_id, parent=parent)
            self._memo[keys] = hashes
            if len(self._memo) > self.capacity:
                self._memo.popitem(last=False)
        return hashes

    def hashes(self, request: WorkloadRequest, token_ids: list[int],
               shared_len: int | None = None) -> list[BlockHash]:
        """Hashes of every full block of the prompt ``token_ids`` of ``request``."""
        shared = self.shared_hashes(request, token_ids, shared_len)
        start = len(shared) * self.block_size
        end = len(token_ids) // self.block_size * self.block_size
        if start == end:
            return list(shared)
        parent = shared[-1] if shared else None
        return shared + block_hashes(token_ids[start:end], self.block_size,
                                     model_id=self.model_id, parent=parent)
