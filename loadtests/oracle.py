"""Two reference token hit rates for a request stream: a true upper bound, and what a fixed
(static) placement of cached blocks would reach.

``upper_bound``: an unlimited cache shared by the whole fleet. Every block of every prompt
stays cached once computed, so the only misses are each block's first computation: a
block used (within the engine's lookup cap of ``(prompt_len - 1) // block_size`` blocks)
by ``u`` requests is hit at most ``u - 1`` times, or ``u`` times where some prompt computes
it past its own cap (a prompt of whole blocks computes its last block without looking it
up). Blocks enter a cache only by being computed (generated tokens never match a later
prompt's), so no policy, cache size or eviction order can beat it: it is a bound, if a
loose one where the fleet's cache is small.

``static_oracle``: the best *fixed* set of blocks in the fleet's total idle KV
(``capacity_blocks``), placed wherever needed and held for the whole run. A request hits
the blocks of its shared leading segments that are in the set, up to the lookup cap; the
first request to use a block computes it, every later one hits it. A block used by ``c``
requests saves ``(c - 1) x block_size`` tokens; a block is never used by more requests
than its parent, so taking blocks by descending count (parents first on ties) yields a
prefix-closed set, the best static one. This is **not** an upper bound on what a policy
reaches: real caches change over the run (a chat's conversation is cached while it lasts,
then evicted for the next), so on ``chat-apps`` a policy beats it. It says how much a
stream's reuse fits in the fleet's idle KV at once.

Blocks outside the shared leading segments (the one-off tail) are never counted by the
static oracle; the upper bound hashes every prompt whole. Token counts are the replicas'
(``prompts``: the workload's own ids by default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kvwire.block_hashing import BlockHash
from loadtests.prefix_hashes import PrefixHashes
from loadtests.replica_prompts import ReplicaPrompts, WorkloadIds
from loadtests.workloads import WorkloadRequest


@dataclass(frozen=True, slots=True)
class StaticOracle:
    token_hit_rate: float
    hit_tokens: int
    prompt_tokens: int
    blocks_kept: int
    capacity_blocks: int


@dataclass(frozen=True, slots=True)
class UpperBound:
    token_hit_rate: float
    hit_tokens: int
    prompt_tokens: int
    distinct_blocks: int  # the cache it takes: every block any prompt computes


def upper_bound(requests: Sequence[WorkloadRequest], hashes: PrefixHashes,
                prompts: ReplicaPrompts | None = None) -> UpperBound:
    """The token hit rate of an unlimited cache shared by the fleet: no policy, cache size
    or eviction order reaches more on ``requests``."""
    prompts = prompts or WorkloadIds()
    bs = hashes.block_size
    uses: Counter[BlockHash] = Counter()  # requests that may hit the block (within the cap)
    past_cap: set[BlockHash] = set()  # blocks some prompt computes without looking them up
    prompt_tokens = 0
    for req in requests:
        ids = prompts.ids(req)
        prompt_tokens += len(ids)
        chain = hashes.hashes(req, ids, prompts.shared_len(req))
        cap = max(0, (len(ids) - 1) // bs)
        uses.update(chain[:cap])
        past_cap.update(chain[cap:])
    hit_blocks = sum(n if h in past_cap else n - 1 for h, n in uses.items())
    return UpperBound(
        token_hit_rate=hit_blocks * bs / prompt_tokens if prompt_tokens else 0.0,
        hit_tokens=hit_blocks * bs,
        prompt_tokens=prompt_tokens,
        distinct_blocks=len(uses.keys() | past_cap),
    )


def static_oracle(requests: Sequence[WorkloadRequest], hashes: PrefixHashes,
                  capacity_blocks: int, prompts: ReplicaPrompts | None = None) -> StaticOracle:
    """The token hit rate of the best fixed set of ``capacity_blocks`` cached blocks (not an
    upper bound on a policy's: see the module's docstring)."""
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
    return StaticOracle(
        token_hit_rate=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        hit_tokens=hit_tokens,
        prompt_tokens=prompt_tokens,
        blocks_kept=len(kept),
        capacity_blocks=capacity_blocks,
    )
