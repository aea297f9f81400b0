"""The token hit rate an oracle placement would reach on a request stream.

The oracle knows every request in advance and holds a fixed set of KV blocks in the
fleet's total idle KV (``capacity_blocks``), placed wherever needed. A request hits the
blocks of its prompt that are in the set, up to the engine's cap of
``(prompt_len - 1) // block_size`` blocks; the first request to use a block computes it
(a compulsory miss), every later one hits it.

Choosing the set: a block used by ``c`` requests saves ``(c - 1) x block_size`` tokens.
A block is never used by more requests than its parent, so taking blocks by descending
count (parents first on ties) yields a prefix-closed set, the best static one.

Blocks outside the shared leading segments (the one-off tail) are used once and never
counted; only ``PrefixHashes.shared_hashes`` is consulted. Token counts are the replicas'
(``prompts``: the workload's own ids by default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from loadtests.prefix_hashes import PrefixHashes
from loadtests.replica_prompts import ReplicaPrompts, WorkloadIds
from loadtests.workloads import WorkloadRequest


@dataclass(frozen=True, slots=True)
class OracleBound:
    token_hit_rate: float
    hit_tokens: int
    prompt_tokens: int
    blocks_kept: int
    capacity_blocks: int


def oracle_bound(requests: Sequence[WorkloadRequest], hashes: PrefixHashes,
                 capacity_blocks: int, prompts: ReplicaPrompts | None = None) -> OracleBound:
    """Upper bound on the token hit rate of any static placement of ``capacity_blocks``."""
    prompts = prompts or WorkloadIds()
    bs = hashes.block_size
    # Requests with the same shared prefix and the same cap use the same blocks: count
    # such groups first, then spread each group's count over its blocks.
    groups: Counter[tuple[tuple[str, ...], int]] = Counter()
    by_group: dict[tuple[tuple[str, ...], int], WorkloadRequest] = {}
    prompt_tokens = 0
    for req in requests:
        prompt_len = prompts.prompt_len(req)
        prompt_tokens += prompt_len
        shared = tuple(seg.key for seg in req.shared_segments())
        if not shared:
            continue
        usable = min(prompts.shared_len(req) // bs, (prompt_len - 1) // bs)
        if usable <= 0:
            continue
        key = (shared, usable)
        groups[key] += 1
        by_group.setdefault(key, req)
    uses: Counter[bytes] = Counter()
    depth: dict[bytes, int] = {}
    for key, count in groups.items():
        req = by_group[key]
        chain = hashes.shared_hashes(req, prompts.ids(req), prompts.shared_len(req))[: key[1]]
        for i, h in enumerate(chain):
            uses[h] += count
            depth[h] = i
    ranked = sorted(uses, key=lambda h: (-uses[h], depth[h]))
    kept = [h for h in ranked[:capacity_blocks] if uses[h] > 1]
    hit_tokens = sum((uses[h] - 1) * bs for h in kept)
    return OracleBound(
        token_hit_rate=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        hit_tokens=hit_tokens,
        prompt_tokens=prompt_tokens,
        blocks_kept=len(kept),
        capacity_blocks=capacity_blocks,
    )
