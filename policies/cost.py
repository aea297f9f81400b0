"""``cost``: choose the replica with the lowest predicted time to first token, counting
what the admission would evict, with one-off prefixes kept on a small scratch set.

In front of LRU prefix caches (vLLM, SGLang) one home per document tops out early: the
documents seen once churn every cache they pass through and evict the hot ones, and a
single load bound trades hits against the tail. This policy keeps three things:

* a **cache model** per replica (``cache_model``): an LRU, within the replica's KV
  capacity, of the prompt chains this gateway sent there, aged by the prefill the
  replica's counters show that this gateway did not send (other gateway copies');
* a **frequency sketch** (``frequency``) over prefix keys (a document, a conversation):
  a key seen at least ``hot_min_count`` times lately (decayed) is *hot*, else *rare*;
  one placed on a home stays hot while it keeps ``hot_keep_count`` (hysteresis);
* the fleet's **pace** (``pace``): seconds per prefilled token, learned from first-token
  times, and the recent prefill load of rare prefixes.

The prompt is never tokenized: the gateway hands over hashes of its ``chunk_chars``-
character pieces (``prompt_chunks``; 16 token ids a piece when the prompt came as ids),
each worth ``chunk_tokens`` gateway tokens. The cache model's entries are chained keys of
``block_chunks`` pieces, so a chat's later turn, which repeats the earlier ones, matches
them on the replica that served them.

Prefix key: a stable hash of (model, cache salt) and the affinity key header, or else
``key_chunks`` pieces after a learned common prefix (a system prompt most traffic shares):
a document, or an app's system prompt and tools.

Scratch set: the first ``S`` healthy replicas on the ring walked from a fixed key, so it
is stable and every gateway copy agrees on it; ``S`` is the rare prefixes' prefill load
(in replicas) over ``scratch_utilization``, between ``min_scratch`` and
``max_scratch_fraction`` of the fleet; it grows a replica at a time, a sketch window apart.

Candidates: the replicas the model says hold part of the prompt; for a hot key its homes:
the first is placed by ``placement`` (the first non-scratch replica on the ring walked from
the key whose cache still has room for the hot keys placed before it in key order, or else
the first scratch replica whose cache has room (``placement_overflow``), or else one within
a fair share of them: ring hashing alone overfills some LRU caches and underfills others;
the homes depend on the hot set alone, so every gateway copy agrees on them), the
next ones follow on the ring; one home, or as many as the key's share of the requests
needs (share x replicas x ``hot_spread``: an app's system prompt), and once those wait more
than ``spill_wait`` prefills of what waiting there saves, up to ``homes`` of them and the
least loaded replicas (what it saves: the part of the prompt the first homes hold, and of
the rest the chance that the first home, an LRU cache, still holds it when the key comes
again, by Che's approximation from the key's request rate and the cache's turnover:
``spill_survival``; where the hot set outgrows the fleet's KV and the caches thrash, a
queued home is no longer waited for); for a rare key its first ring replica outside the
scratch set while that cache has room for it (``fill_homes``: caches still filling, so its
next request hits there), else the scratch set and the least loaded replica. For each, in
seconds, with ``t`` the pace over the replica's weight::

    wait     = queued tokens x t, less the part of the oldest queued request the replica
               is likely through (its age, at most its own prefill); or, when longer,
               slot_weight x the wait for a free decode slot (``slots``)
    prefill  = prefill_weight x (prompt tokens - predicted cached tokens) x t
    evict    = eviction_weight x t x (hot tokens the admission would evict from the model,
               but for entries of its own prefix key); rare_eviction_weight for a rare key
    scratch  = scratch_loss x prompt tokens x t, for a hot key on a scratch replica that
               is not its home (the churn there will likely evict it before it is used
               again)
    late     = tail_weight x how far the predicted first token (wait + uncached tokens x
               t) falls past (1 + tail_slack) x prompt tokens x t, what an idle replica
               holding none of the prompt would give: a request that late is in the tail
               round robin's fleet would not have, while a shorter wait costs the tail
               nothing
    score    = wait + prefill + evict + scratch + late     lowest wins; ties in ring order

Where a replica publishes KV events (``kv_events``), what it holds is known exactly: the
gateway then tokenizes the whole prompt (``tokens_needed`` turns ``None`` once the index
has heard from a replica) and the exact index (``kv_index``) replaces the model's
prediction of cached tokens for every replica it hears from; but for a prompt whose prefix
key (its document, its conversation) went there in the last ``kv_event_grace_s`` (its
blocks may not be stored yet), which keeps the larger of the two. Until a first prompt
matches a block in the index, a prompt that matches none keeps the model's prediction: it
may be new, or the gateway's tokens may not be the engines' (another tokenizer), which no
block would ever match; after ``_UNMATCHED_LIMIT`` such prompts that the model says a
publishing replica holds (one with blocks in the index, sent there before the grace) the
index is no longer read and the prompt no longer tokenized (``describe``:
``kv_events_unmatched``). The model still predicts what an admission evicts.

``/admin/explain`` shows each term per candidate scored (a candidate whose wait, prefill
and scratch terms alone exceed the best total is ranked after them unscored). Reasons:
``cache_match`` (the winner is predicted to hold part of the prompt), ``affinity`` (a hot
key on one of its homes, or a rare one on the home whose cache has room), ``scratch`` (a
rare key on the scratch set), ``spill``
(anything else).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from itertools import compress
from operator import itemgetter
from typing import NamedTuple

from policies.base import (
    Decision,
    Finished,
    Policy,
    ReplicaRemoved,
    ReplicaReset,
    ReplicaScore,
    ReplicaView,
    Routed,
    RouteEvent,
    RouteRequest,
    healthy,
)
from policies.cache_model import (
    ChainEntry,
    PromptChain,
    ReplicaCacheModel,
    match_models,
)
from policies.common_prefix import check_settings, learner_for
from policies.frequency import FrequencySketch
from policies.kv_index import KVIndex
from policies.pace import DecayedRate, PrefillPace
from policies.placement import HotPlacement, Overflow
from policies.prefix_affinity import request_namespace
from policies.prompt_chunks import IDS_PER_CHUNK, id_chunks
from policies.ring import RingCache, stable_hash, token_bytes, walk
from policies.slots import DecodeSlots

_SCRATCH_KEY = stable_hash(b"kvgate-scratch-set")
# a view's fields by position (it is a named tuple): cheaper than by name, once per replica
# per decision
_ID, _WEIGHT, _HEALTHY = (itemgetter(ReplicaView._fields.index(name))
                          for name in ("id", "weight", "healthy"))
_REFRESH_S = 0.25  # arrival seconds between reads of the views' slowly changing gauges
_CHURN_BLOCK = 256  # tokens of others' prefill that enter a model as one entry
_CHURN_OWNER = stable_hash(b"kvgate-others-prefill")  # the owner of those entries
# what this copy routed uncached is the model's prediction; a replica's prefill counter up
# to this factor above it is taken as the prediction's error, not as others' traffic
_OWN_MARGIN = 1.25
# prompts that matched no block the index held, none matching before them, after which the
# gateway's tokens are taken not to be the engines' (another tokenizer): the index is no
# longer read
_UNMATCHED_LIMIT = 1024
# requests judged hot or rare (routed after the sketch's first window) before the scratch
# set is first sized from their load: sized from the first few, it grew and shrank again,
# and moved the homes placed on the replicas in between each time
_JUDGED_MIN = 128
_NAMESPACES_KEPT = 1024  # (model, cache salt) pairs whose key hashes are kept
_NAMESPACE_KEPT_BYTES = 512  # ... when their names take at most this many bytes
_HINTS_KEPT = 1 << 14  # prefix keys whose entries held at the last match are kept


@dataclass(frozen=True, slots=True)
class CostConfig:
    """See ``presets/cost.yaml`` for what each key means."""

    chunk_chars: int = 64
    block_chunks: int = 8
    key_chunks: int = 16
    max_chunks: int = 8192
    homes: int = 2
    spill_wait: float = 1.0
    hot_spread: float = 1.5
    vnodes: int = 256
    hot_min_count: int = 3
    hot_keep_count: int = 1
    window_factor: float = 4.0
    sketch_width: int = 1 << 16
    sketch_depth: int = 4
    min_scratch: int = 1
    max_scratch_fraction: float = 0.5
    scratch_utilization: float = 0.6
    max_scratch_utilization: float = 0.85
    load_window_s: float = 60.0
    eviction_weight: float = 0.5
    rare_eviction_weight: float = 0.75
    scratch_loss: float = 0.5
    prefill_weight: float = 2.0
    fill_homes: bool = True
    slot_weight: float = 2.0
    tail_slack: float = 0.2
    tail_weight: float = 0.5
    placement_slack: float | None = 0.05
    placement_fill: float = 0.9
    placement_overflow: bool = True
    spill_survival: bool = True
    prefill_s_per_token: float = 1e-4
    capacity_fraction: float = 1.0
    default_capacity_tokens: int = 200_000
    learn_common_prefix: bool = True
    common_share: float = 0.5
    common_window: int = 1024
    common_block: int = 8
    common_min_samples: int = 64
    max_common_prefix: int = 512
    common_lookahead: int = 128
    kv_events: bool = True
    kv_block_size: int = 16
    kv_event_grace_s: float = 5.0

    def validate(self) -> None:
        check_settings(self)
        for key in ("chunk_chars", "block_chunks", "key_chunks", "max_chunks", "homes", "vnodes",
                    "hot_min_count", "default_capacity_tokens", "common_lookahead",
                    "kv_block_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)!r}")
        for key in ("window_factor", "scratch_utilization", "max_scratch_utilization",
                    "load_window_s", "spill_wait",
                    "hot_spread", "prefill_weight",
                    "prefill_s_per_token", "kv_event_grace_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        if not 1 <= self.hot_keep_count <= self.hot_min_count:
            raise ValueError(f"hot_keep_count must be in [1, hot_min_count "
                             f"({self.hot_min_count})], got {self.hot_keep_count!r}")
        if self.min_scratch < 0:
            raise ValueError(f"min_scratch must be >= 0, got {self.min_scratch!r}")
        if not 0.0 <= self.max_scratch_fraction < 1.0:
            raise ValueError(
                f"max_scratch_fraction must be in [0, 1), got {self.max_scratch_fraction!r}")
        for key in ("eviction_weight", "rare_eviction_weight", "scratch_loss", "slot_weight",
                    "tail_slack", "tail_weight"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if self.placement_slack is not None and not self.placement_slack >= 0:
            raise ValueError(f"placement_slack must be >= 0 or null, got {self.placement_slack!r}")
        if not 0.0 < self.placement_fill <= 1.0:
            raise ValueError(f"placement_fill must be in (0, 1], got {self.placement_fill!r}")
        if not 0.0 < self.capacity_fraction <= 1.0:
            raise ValueError(
                f"capacity_fraction must be in (0, 1], got {self.capacity_fraction!r}")
        if self.sketch_width < 2 or self.sketch_width & (self.sketch_width - 1):
            raise ValueError(f"sketch_width must be a power of two >= 2, got {self.sketch_width!r}")
        if not 1 <= self.sketch_depth <= 8:
            raise ValueError(f"sketch_depth must be in [1, 8], got {self.sketch_depth!r}")


class _Prepared(NamedTuple):
    """What ``choose`` and ``observe`` both derive from one request."""

    key: int
    units: memoryview  # the prompt's chunk hashes as u32 bytes (at most max_chunks)
    chain: PromptChain
    seen: int  # the key's decayed count before this request


class _Model(NamedTuple):
    model: ReplicaCacheModel
    epoch: int


class Cost(Policy):
    """Lowest predicted time to first token over a cache model; see the module docstring."""

    name = "cost"
    reasons = ("cache_match", "affinity", "scratch", "spill")

    def __init__(self, config: CostConfig | None = None) -> None:
        self.config = cfg = config or CostConfig()
        self.chunk_chars = cfg.chunk_chars
        self.kv_index = KVIndex(cfg.kv_block_size) if cfg.kv_events else None
        self._rings = RingCache(cfg.vnodes)
        self._mean_prompt = 0.0
        self._sketch = FrequencySketch(cfg.sketch_width, cfg.sketch_depth,
                                       window=self._window(0))
        self._pace = PrefillPace(cfg.prefill_s_per_token)
        self._slots = DecodeSlots()
        self._all_load = DecayedRate(cfg.load_window_s)  # uncached tokens routed
        self._requests = DecayedRate(cfg.load_window_s)  # requests routed
        self._own_load: dict[str, DecayedRate] = {}  # ... per replica
        self._churn: dict[str, float] = {}  # others' prefill not yet in the model, tokens
        self._churn_key = 0  # the last churn entry's key
        # ... of them once the sketch has seen a window (before, every key looks rare), and
        # of those for rare keys: the scratch set's size
        self._judged_load = DecayedRate(cfg.load_window_s)
        self._judged = 0
        self._rare_load = DecayedRate(cfg.load_window_s)
        self._models: dict[str, _Model] = {}
        self._heads: dict[int, set[str]] = {}  # a chain's first key -> models holding it
        # replica -> prefix key (document, conversation) routed there -> when (with KV
        # events: the blocks it stores are not in the index until its prefill is done)
        self._sending: dict[str, dict[int, float]] = {}
        # prompts the index matched nowhere (while it held blocks) before one matched; once
        # one has, the gateway's tokens are the engines' and the index is the truth
        self._unmatched = 0
        self._index_agrees = False
        self._index_memo: tuple[RouteRequest, bool] | None = None  # choose's last: matched?
        self._facts: dict[str, tuple[int, int | None]] = {}  # id -> (epoch, capacity)
        self._fleet_prefill: float | None = None  # scraped prefill tokens/s, all replicas
        self._scratch_size = cfg.min_scratch
        self._grown_at = -(1 << 62)  # self._routed when the scratch set last grew
        self._routed = 0
        self._memo: tuple[RouteRequest, _Prepared] | None = None
        self._namespaces: dict[tuple[str | None, str | None], tuple[blake2b, int]] = {}
        self._held_hints: dict[int, int] = {}  # prefix key -> entries held at its last match
        self._learner = learner_for(cfg)
        self._chain_digests = cfg.common_block == cfg.block_chunks
        # the replicas of the last hot decision: (ids, weights, healthy, scratch indexes)
        self._eligible: tuple[list[str], list[float], list[bool], set[int]] = (
            [], [], [], set())
        self._refreshed: tuple[float, int] | None = None  # (arrival, healthy count)
        self._mean_room = 0.0  # mean of ``_room`` over the replicas seen (``_refresh``)
        self._index: tuple[list[str], dict[str, int]] = ([], {})  # the last order seen
        self._placement = HotPlacement(cfg.placement_slack or 0.0, cfg.sketch_width // 8)
        # the last scratch set: (ring points, their owners as indexes of the views, size,
        # healthy flags, indexes); one membership in another order shares the points
        self._scratch_memo: tuple[list[int], list[int], int, list[bool], list[int]] | None \
            = None
        # owners known hot since the sketch last halved (counts only grow in between)
        self._hot_owners: tuple[int, set[int]] = (0, set())

    # -- what a request is --------------------------------------------------------------
    @property
    def tokens_needed(self) -> int | None:  # type: ignore[override]
        """None (the whole prompt, to match in the exact index) once some replica's KV
        events reach it; else 0: the prompt's chunk hashes are all this policy reads."""
        return None if self._use_index() else 0

    def _use_index(self) -> bool:
        kv = self.kv_index
        return kv is not None and kv.fed and (self._index_agrees
                                               or self._unmatched < _UNMATCHED_LIMIT)

    @property
    def scratch_size(self) -> int:
        return self._scratch_size

    @property
    def pace_s_per_token(self) -> float:
        return self._pace.value_s

    def _units(self, request: RouteRequest) -> tuple[Sequence[int], float]:
        """The prompt's chunk hashes (at most ``max_chunks``) and tokens per chunk (from
        the request's own chunks, or cut from its token ids when it has none)."""
        if request.chunks:
            chunks, unit = request.chunks, max(request.chunk_tokens, 1e-9)
        else:
            chunks, unit = id_chunks(request.tokens), float(IDS_PER_CHUNK)
        limit = self.config.max_chunks
        return (chunks[:limit] if len(chunks) > limit else chunks), unit

    def _namespace(self, request: RouteRequest) -> tuple[blake2b, int]:
        """For the request's model and cache salt: a hash of them to start its prefix key
        from, and its chain's root (kept for the last ``_NAMESPACES_KEPT`` pairs of short
        names: a model name is as long as a client makes it)."""
        name = (request.model, request.cache_salt)
        found = self._namespaces.get(name)
        if found is None:
            space = request_namespace(request)
            found = (blake2b(space, digest_size=8, person=b"kvgate-cost"), stable_hash(space))
            if len(space) <= _NAMESPACE_KEPT_BYTES:
                if len(self._namespaces) >= _NAMESPACES_KEPT:
                    self._namespaces.clear()
                self._namespaces[name] = found
        return found

    def _key(self, request: RouteRequest, units: memoryview, chain: PromptChain) -> int:
        """The request's prefix key (stable across processes)."""
        h = self._namespace(request)[0].copy()
        if request.affinity_key is not None:
            h.update(b"\x01" + request.affinity_key.encode())
        else:
            n = len(units) // 4
            learner, skip = self._learner, 0
            if learner is not None:
                # the chain's keys name the same prefixes as the learner's digests when
                # their blocks agree (the preset's), and are hashed once for both
                skip = learner.skip_digests(chain.key, n) if self._chain_digests \
                    else learner.skip(units, n)
            # units holds 4 bytes per chunk: [4*skip, 4*(skip+K)) is the hashed window
            h.update(b"\x00")
            h.update(units[4 * skip : 4 * (skip + self.config.key_chunks)])
        return int.from_bytes(h.digest(), "little")

    def _prepare(self, request: RouteRequest) -> _Prepared:
        """Key, chain and count of ``request``, derived once for ``choose`` and the
        ``observe(Routed)`` that follows it."""
        memo = self._memo
        if memo is not None and memo[0] is request:
            return memo[1]
        chunks, unit = self._units(request)
        units = token_bytes(chunks)
        chain = PromptChain(units, self.config.block_chunks, unit, self._namespace(request)[1])
        key = self._key(request, units, chain)
        prepared = _Prepared(key, units, chain, self._sketch.estimate(key))
        self._memo = (request, prepared)
        return prepared

    def _hot(self, key: int, count: int) -> bool:
        """Whether prefix ``key``, counted ``count`` lately, is hot: ``hot_min_count``, or
        ``hot_keep_count`` once it is placed on a home. Without the lower bar a hot key
        whose count dipped under ``hot_min_count`` at a halving (a few requests a window,
        drawn at random) went to the scratch set and left the placement for a window,
        and the homes of the keys after it were placed again (offline, contracts-400,
        3,900 requests: 62 hot requests missed on a replica other than their document's
        previous one, 46 with it)."""
        cfg = self.config
        return count >= cfg.hot_min_count or (
            count >= cfg.hot_keep_count and self._placement.home_of(key) is not None)

    # -- the decision ---------------------------------------------------------------------
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        cfg = self.config
        up = list(map(_HEALTHY, replicas))
        n_ok = up.count(True)
        if not n_ok:
            healthy(replicas)  # names the error
        self._refresh(replicas, up, n_ok, request.arrival_s)
        ids = list(map(_ID, replicas))
        weights = list(map(_WEIGHT, replicas))
        ring, owners = self._rings.layout(ids, weights)
        index = self._index_of(ids)
        prep = self._prepare(request)
        p = max(1, request.prompt_tokens)
        hot = self._hot(prep.key, prep.seen)
        pace = self._pace.value_s
        points, distinct = ring.points, len(ring)

        scratch = self._scratch(points, owners, distinct, up, n_ok)
        in_scratch = set(scratch)
        waits: dict[int, float] = {}

        def wait_of(i: int) -> float:
            w = waits.get(i)
            if w is None:
                w = waits[i] = self._wait(replicas[i], pace)
            return w

        # candidates, in the order ties are broken by
        candidates: dict[int, None] = {}
        matched = self._matches(prep, replicas, index, up, p)
        if self._use_index():
            matched = self._indexed(request, prep, replicas, up, p, matched)
        homes: list[int] = []
        rare_home: int | None = None
        first: int | None = None  # a hot key's placed home (on the scratch set: overflow)
        if hot:
            eligible = n_ok - len(scratch)
            # a prefix carrying more than a replica's share of the requests (an app's
            # system prompt) gets as many homes as its share needs
            share = prep.seen / self._sketch.total if self._sketch.total > 0 else 0.0
            spread = max(1, min(eligible, math.ceil(share * eligible * cfg.hot_spread)))
            first = self._home(prep, p, ids, index, points, owners, distinct, up, in_scratch)
            if first is not None:
                homes.append(first)
            for i in walk(points, owners, distinct, prep.key):
                if len(homes) >= max(cfg.homes, spread):
                    break
                if up[i] and i not in in_scratch and i != first:
                    homes.append(i)
            # the first homes, which every gateway copy agrees on; the others, and the
            # least loaded, only once those are behind by the prefill waiting there saves
            firsts = homes[:spread]
            waited = min(map(wait_of, firsts)) if firsts else 0.0
            # (an idle first home is never busy: the saving is not asked for then)
            busy = not firsts or (waited > 0.0 and waited > cfg.spill_wait * pace
                                  * self._saved_at_home(p, firsts, matched, replicas, share,
                                                        request.arrival_s))
            candidates.update(dict.fromkeys(homes if busy else firsts))
            self._eligible = (ids, weights, up, in_scratch)
        else:
            busy = True
            rare_home = self._roomy_home(p, replicas, points, owners, distinct, up,
                                         in_scratch, prep.key)
            if rare_home is not None and wait_of(rare_home) \
                    <= cfg.spill_wait * p * pace:
                # caches still filling (a fresh gateway, a new replica): the prefix goes
                # where it would live if it turned hot, so its second request hits
                candidates[rare_home] = None
                busy = False
            else:
                candidates.update(dict.fromkeys(scratch))
        candidates.update(dict.fromkeys(i for i, m in matched.items() if m > 0))

        # the cheap terms first: a candidate whose wait + prefill + scratch already
        # exceeds the best total cannot win, and its eviction walk is skipped
        hot_memo: dict[int, bool] = {}
        # (total, order, index, terms, bound): bound = the terms but eviction
        scored: list[tuple[float, int, int, tuple[tuple[str, float], ...], float]] = []
        pruned: list[int] = []
        best_total = math.inf

        # the terms' constant factors, taken once (each product as the terms multiply it)
        prefill_weight, tail_weight = cfg.prefill_weight, cfg.tail_weight
        misplaced_p, late_p = cfg.scratch_loss * p, (1.0 + cfg.tail_slack) * p
        evicts = cfg.eviction_weight > 0 or cfg.rare_eviction_weight > 0
        evict_s = (cfg.eviction_weight if hot else cfg.rare_eviction_weight) * pace
        churn_scale = 1.0 if hot or not evicts else self._fleet_scale()
        hot_owner = self._hot_owner()
        inf = math.inf

        def score(batch: list[int], first_order: int) -> None:
            nonlocal best_total
            bounds: list[tuple[float, int, int, float, float, float, float]] = []
            for order, i in enumerate(batch, first_order):
                w = replicas[i].weight
                t = pace / w if w > 0 else inf
                wait = wait_of(i)
                uncached = (p - matched.get(i, 0)) * t
                prefill = uncached * prefill_weight
                misplaced = misplaced_p * t if hot and i in in_scratch and i != first else 0.0
                # past the first token an idle replica would give the whole prompt
                # uncached, with tail_slack, this request would be in the tail
                over = wait + uncached - late_p * t
                late = tail_weight * over if over > 0.0 else 0.0
                bounds.append((wait + prefill + misplaced + late, order, i, wait, prefill,
                               misplaced, late))
            bounds.sort()
            for bound, order, i, wait, prefill, misplaced, late in bounds:
                if bound > best_total:
                    pruned.append(i)
                    continue
                evict = 0.0
                if evicts:
                    m = matched.get(i, 0)
                    churn = p - m if hot else round((p - m) * churn_scale)
                    evict = evict_s * self._hot_victims(replicas[i].id, churn, prep.key,
                                                        hot_owner, hot_memo)
                total = bound + evict
                if total < best_total:
                    best_total = total
                terms = (("wait_s", wait), ("prefill_s", prefill), ("evict_s", evict),
                         ("scratch_s", misplaced), ("late_s", late))
                scored.append((total, order, i, terms, bound))

        score(list(candidates), 0)
        # the least loaded replicas (a pass over the fleet) are candidates too when the
        # others are busy, unless they cannot win: one not yet a candidate holds nothing
        # of the prompt, so it costs at least its whole prefill
        if busy and (not scored or best_total > cfg.prefill_weight * p * pace / max(weights)):
            least, least_outside = self._least_loaded(replicas, up, in_scratch, prep.key)
            extra = [least] if least not in candidates else []
            if hot and in_scratch and least_outside not in candidates \
                    and least_outside != least:
                extra.append(least_outside)
            candidates.update(dict.fromkeys(extra))
            score(extra, len(candidates) - len(extra))
            # as if scored in one pass: those the new best total would have passed over
            # count as unscored
            passed = sorted(entry for entry in scored if entry[4] > best_total)
            if passed:
                scored = [entry for entry in scored if entry[4] <= best_total]
                pruned[:0] = [entry[2] for entry in passed]
        scored.sort()
        best = scored[0][2]
        if matched.get(best, 0) > 0:
            reason = "cache_match"
        elif hot:
            reason = "affinity" if best in homes else "spill"
        elif best in in_scratch:
            reason = "scratch"
        else:
            reason = "affinity" if best == rare_home else "spill"
        ranked_idx = [entry[2] for entry in scored] + pruned
        rest = up.copy()  # the other healthy replicas follow in the fleet's order
        for i in ranked_idx:
            rest[i] = False
        scores = tuple([ReplicaScore(ids[i], total, matched.get(i, 0), terms)
                        for total, _, i, terms, _ in scored])
        return Decision(tuple([ids[i] for i in ranked_idx] + list(compress(ids, rest))),
                        reason, matched.get(best, 0), scores)

    def _saved_at_home(self, p: int, firsts: list[int], matched: dict[int, int],
                       replicas: Sequence[ReplicaView], share: float, now: float | None
                       ) -> float:
        """Prompt tokens that waiting for a hot key's first homes saves (``spill_survival``):
        what they hold of the prompt, and of the rest the chance that the first home still
        holds it when the key is asked again; without it, the whole prompt."""
        if not self.config.spill_survival or now is None:
            return p
        held = max(matched.get(i, 0) for i in firsts)
        if held >= p:
            return held
        return held + (p - held) * self._survival(replicas[firsts[0]], share, now)

    def _survival(self, r: ReplicaView, share: float, now: float) -> float:
        """Che's approximation for an LRU cache: the chance that a prefix with ``share`` of
        the requests is asked again before it reaches the LRU end of ``r``'s cache, which
        takes (capacity, plus the room still free) / (tokens the cache takes in a second)
        seconds. Where caches thrash (a hot set larger than the fleet's KV) it is low and a
        queued home is not worth waiting for: the prompt would be evicted before its next
        use anyway."""
        held = self._models.get(r.id)
        own = self._own_load.get(r.id)
        inflow = max(own.rate(now) if own is not None else 0.0, r.prefill_tokens_per_s or 0.0)
        if held is None or inflow <= 0:
            return 1.0
        model = held.model
        turnover = (2 * model.capacity - min(model.used, model.capacity)) / inflow
        return -math.expm1(-share * self._requests.rate(now) * turnover)

    def _roomy_home(self, p: int, replicas: Sequence[ReplicaView], points: list[int],
                    owners: list[int], distinct: int, up: list[bool], in_scratch: set[int],
                    key: int) -> int | None:
        """The key's first ring replica outside the scratch set, when its model has room
        for ``p`` more tokens and for the hot prefixes placed there (admitting the prompt
        would evict nothing); else None."""
        if not self.config.fill_homes:
            return None
        for i in walk(points, owners, distinct, key):
            if up[i] and i not in in_scratch:
                rid = replicas[i].id
                held = self._models.get(rid)
                used = 0 if held is None else held.model.used
                room = self._room(rid)
                return i if max(used, self._placement.tokens_on(rid)) + p <= room else None
        return None

    def _refresh(self, replicas: Sequence[ReplicaView], up: list[bool], n_ok: int,
                 now: float | None) -> None:
        """Take the replicas' epochs, capacities, slot gauges and prefill rates from the
        healthy views (``up``, ``n_ok`` of them): at most every ``_REFRESH_S`` of arrival
        time (they change with scrapes, a second or more apart), and whenever the healthy
        count changes."""
        last = self._refreshed
        if now is not None and last is not None and last[1] == n_ok \
                and 0.0 <= now - last[0] < _REFRESH_S:
            return
        self._refreshed = None if now is None else (now, n_ok)
        ok = list(compress(replicas, up))
        facts = self._facts
        for r in ok:
            facts[r.id] = (r.epoch, r.kv_capacity_tokens)
        self._slots.saw_all(ok)
        if last is not None and now is not None and now > last[0]:
            self._age_models(ok, now, now - last[0])
        rates = [r.prefill_tokens_per_s for r in ok]
        self._fleet_prefill = None if None in rates else sum(rates)  # type: ignore[arg-type]
        rooms = [self._room(rid) for rid in facts]
        self._mean_room = sum(rooms) / len(rooms) if rooms else 0.0

    def _age_models(self, ok: list[ReplicaView], now: float, dt: float) -> None:
        """Age each replica's model by the prefill it did that this copy did not send: its
        prefill counter's rate over what this copy routed there uncached. Other gateway
        copies (or clients that bypass the gateway) fill the replica's LRU cache too; each
        ``_CHURN_BLOCK`` tokens of theirs enter the model as one entry no prefix owns, so
        the model evicts as the replica does. (Each copy modelling only its own sends gave
        two copies 0.58 token hit rate where one gets 0.69: their models kept documents
        the other copy's traffic had evicted.)"""
        for r in ok:
            rate = r.prefill_tokens_per_s
            if rate is None:
                continue
            own = self._own_load.get(r.id)
            others = rate - (own.rate(now) * _OWN_MARGIN if own is not None else 0.0)
            if others <= 0:
                continue
            churn = self._churn.get(r.id, 0.0) + others * dt
            if churn >= _CHURN_BLOCK:
                self._churn_key += 1
                model = self._model(r.id)
                self._forget_heads(r.id, model.admit(
                    [ChainEntry(self._churn_key, int(churn))], _CHURN_OWNER))
                churn -= int(churn)
            self._churn[r.id] = churn

    def _index_of(self, ids: list[str]) -> dict[str, int]:
        """Position of each id in ``ids`` (kept for the last order seen)."""
        if self._index[0] != ids:
            self._index = (list(ids), {rid: i for i, rid in enumerate(ids)})
        return self._index[1]

    def _home(self, prep: _Prepared, p: int, ids: Sequence[str], index: dict[str, int],
              points: list[int], owners: list[int], distinct: int, up: list[bool],
              in_scratch: set[int]) -> int | None:
        """Index of a hot key's first home: its placement (``placement``), bounded by
        what each replica's cache holds and by a fair share of the hot keys."""
        if self.config.placement_slack is None:
            for i in walk(points, owners, distinct, prep.key):
                if up[i] and i not in in_scratch:
                    return i
            return None
        placed = self._placement.home_of(prep.key)
        if placed is not None:
            i = index.get(placed, -1)
            if i >= 0 and up[i] and (i not in in_scratch or self.config.placement_overflow):
                return i
        home = self._placement.place(
            prep.key, p, self._order_of(ids, points, owners, distinct, up, in_scratch),
            self._eligible_ids(ids, up, in_scratch), self._room,
            self._overflow(ids, points, owners, distinct, up, in_scratch))
        return None if home is None else index[home]

    @staticmethod
    def _order_of(ids: Sequence[str], points: list[int], owners: list[int],
                  distinct: int, up: list[bool], in_scratch: set[int], scratch: bool = False
                  ) -> Callable[[int], Iterator[str]]:
        """A key's eligible homes (healthy, not scratch; with ``scratch``, the scratch
        replicas instead), lazily in ring order from it."""
        def order(key: int) -> Iterator[str]:
            return (ids[i] for i in walk(points, owners, distinct, key)
                    if up[i] and (i in in_scratch) == scratch)
        return order

    def _overflow(self, ids: Sequence[str], points: list[int], owners: list[int],
                  distinct: int, up: list[bool], in_scratch: set[int]) -> Overflow | None:
        """The scratch set, as where hot keys go that no home has room for
        (``placement_overflow``)."""
        if not self.config.placement_overflow or not in_scratch:
            return None
        return Overflow({ids[i] for i in in_scratch},
                        self._order_of(ids, points, owners, distinct, up, in_scratch,
                                       scratch=True))

    @staticmethod
    def _eligible_ids(ids: Sequence[str], up: list[bool], in_scratch: set[int]) -> set[str]:
        return {rid for i, rid in enumerate(ids) if up[i] and i not in in_scratch}

    def _room(self, replica: str) -> int:
        """Tokens of hot prefixes ``replica``'s cache is taken to hold."""
        cfg = self.config
        capacity = self._facts.get(replica, (0, None))[1] or cfg.default_capacity_tokens
        return int(capacity * cfg.capacity_fraction * cfg.placement_fill)

    def _scratch(self, points: list[int], owners: list[int], distinct: int, up: list[bool],
                 healthy_count: int) -> list[int]:
        """Indexes of the scratch set: the first ``S`` healthy replicas on the ring walked
        from a fixed key (never every healthy replica)."""
        size = min(self._scratch_size, healthy_count - 1)
        memo = self._scratch_memo
        if memo is not None and memo[0] is points and memo[1] is owners \
                and memo[2] == size and memo[3] == up:
            return memo[4]
        out: list[int] = []
        if size > 0:
            for i in walk(points, owners, distinct, _SCRATCH_KEY):
                if up[i]:
                    out.append(i)
                    if len(out) == size:
                        break
        self._scratch_memo = (points, owners, size, list(up), out)
        return out

    def scratch_set(self, replicas: Sequence[ReplicaView]) -> tuple[str, ...]:
        """The ids of the current scratch set over ``replicas``."""
        ring, owners = self._rings.layout([r.id for r in replicas], [r.weight for r in replicas])
        up = [r.healthy for r in replicas]
        return tuple(replicas[i].id for i in self._scratch(ring.points, owners, len(ring), up,
                                                           sum(up)))

    def _wait(self, r: ReplicaView, pace: float) -> float:
        """Predicted seconds before ``r`` starts a new prompt: its queue, less the part of
        its oldest unanswered request it is likely through (that request's age, never more
        than its own prefill); or, when longer, the wait for a free decode slot."""
        w = r.weight
        t = pace / w if w > 0 else math.inf
        queue = r.queued_tokens * t - min(r.pending_age_s, r.pending_head_tokens * t)
        if not queue > 0.0:  # NaN too (a weight of 0 and nothing queued), as max(0.0, ·)
            queue = 0.0
        return max(queue, self._slot_wait(r))

    def _slot_wait(self, r: ReplicaView) -> float:
        """Weighted seconds before a decode slot frees on ``r`` for one more request."""
        if self.config.slot_weight <= 0 or not self._slots.known:
            return 0.0
        in_flight = r.in_flight + r.others_in_flight
        return self.config.slot_weight * self._slots.wait_s(r.id, in_flight)

    def _matches(self, prep: _Prepared, replicas: Sequence[ReplicaView],
                 index: dict[str, int], up: list[bool], p: int) -> dict[int, int]:
        """Predicted cached tokens per replica index (only those holding the first entry)."""
        out: dict[int, int] = {}
        if not prep.chain:
            return out
        holders = self._heads.get(prep.chain.key(0))
        if not holders:
            return out
        models = self._models
        chain, top = prep.chain, p - 1
        # entries held where this prefix was last matched: the first model's hint (mostly
        # right: a document's blocks, then the question's), so it need not bisect
        hints = self._held_hints
        first = hints.get(prep.key, 0)
        where, holding = [], []
        for rid in holders:
            i = index.get(rid)
            if i is not None and up[i]:
                held = models[rid]
                if held.epoch == replicas[i].epoch:
                    where.append(i)
                    holding.append(held.model)
        tokens, hint = match_models(holding, chain, first)
        for i, n in zip(where, tokens, strict=True):
            out[i] = n if n < top else top
        if hint != first and hint:
            if len(hints) >= _HINTS_KEPT:
                hints.clear()
            hints[prep.key] = hint
        return dict(sorted(out.items()))  # in the fleet's order: ties break the same way

    def _indexed(self, request: RouteRequest, prep: _Prepared, replicas: Sequence[ReplicaView],
                 up: list[bool], p: int, matched: dict[int, int]) -> dict[int, int]:
        """``matched`` with the exact index's cached tokens for each replica it hears from
        (see the module docstring)."""
        kv = self.kv_index
        if kv is None or not request.tokens or request.cache_salt is not None:
            return matched  # KV events carry no salt: a salted prompt is not found there
        tracked = [i for i, r in enumerate(replicas) if up[i] and kv.tracks(r.id)]
        if not tracked:
            return matched
        bs = kv.block_size
        blocks = kv.match(request.tokens, [replicas[i].id for i in tracked], (p - 1) // bs)
        if any(blocks.values()):
            self._index_memo = (request, True)  # taken in observe(Routed)
        elif not self._index_agrees:
            # no prompt has matched yet: a new prompt, or the gateway's tokens are not the
            # engines' (another tokenizer). Only a prompt the model says a publishing
            # replica holds (sent there before the grace, and its index holds blocks) tells
            # the two apart; counted in observe(Routed). A new or a short prompt does not,
            # so a burst of them cannot turn the index off.
            if any(matched.get(i, 0) >= bs and kv.num_blocks(replicas[i].id)
                   and not self._sending_now(replicas[i].id, prep.key, request.arrival_s)
                   for i in tracked):
                self._index_memo = (request, False)
            return matched
        out = dict(matched)
        for i in tracked:
            held = blocks[replicas[i].id] * bs
            if self._sending_now(replicas[i].id, prep.key, request.arrival_s):
                held = max(held, out.get(i, 0))  # sent there lately: maybe not stored yet
            if held:
                out[i] = held
            else:
                out.pop(i, None)
        return dict(sorted(out.items()))  # in the fleet's order: ties break the same way

    def _least_loaded(self, replicas: Sequence[ReplicaView], up: list[bool],
                      scratch: set[int], key: int) -> tuple[int, int]:
        """The healthy replicas with the least load (the wait for a decode slot, then the
        queue per unit of weight): over all, and outside ``scratch`` (the first when
        every healthy one is in it). One pass over the fleet.

        Between equally loaded replicas (idle ones, most often) the one over all is a
        scratch replica where there is one: its cache churns already, while a home's
        holds hot prefixes; otherwise ties go to the first in the fleet's order counted
        from ``key`` (the prefix key), so one prefix's spills land on one replica and no
        replica takes every prefix's. Taken first in the fleet's order instead, the
        fleet's first replica took most spills and lost the most hot documents (offline,
        LRU engines, 20,000 requests: contracts token hit 0.655 -> 0.664, contracts-400
        0.720 -> 0.725)."""
        inf = math.inf
        best = outside = -1
        best_wait = best_queue = outside_wait = outside_queue = inf
        limits = self._slots.limits if self._slots.known and self.config.slot_weight > 0 \
            else None
        n = len(replicas)
        start = key % n if n else 0
        for j in range(start, start + n):  # the hot loop of a decision: kept plain
            i = j if j < n else j - n
            if not up[i]:
                continue
            r = replicas[i]
            w = r.weight
            queue = r.queued_tokens / w if w > 0 else inf
            wait = 0.0
            if limits:  # a decode-slot wait is only above 0 where the slots are full
                limit = limits.get(r.id)
                if limit is not None and r.in_flight + r.others_in_flight >= limit:
                    wait = self._slot_wait(r)
            if wait < best_wait or (wait == best_wait and (
                    queue < best_queue or (queue == best_queue and i in scratch
                                           and best not in scratch))):
                best, best_wait, best_queue = i, wait, queue
            if (wait < outside_wait or (wait == outside_wait and queue < outside_queue)) \
                    and i not in scratch:
                outside, outside_wait, outside_queue = i, wait, queue
        if best < 0:
            raise ValueError("no healthy replica to choose from")
        return best, outside if outside >= 0 else best

    def _hot_owner(self) -> Callable[[int], bool]:
        """Whether a cache entry's owner (a prefix key) is hot: ``_hot`` of its count,
        with the owners found hot kept until the sketch halves (counts only grow
        between two halvings)."""
        sketch = self._sketch
        halvings, hot = self._hot_owners
        if halvings != sketch.halvings:
            hot = set()
            self._hot_owners = (sketch.halvings, hot)

        def counts(owner: int) -> bool:
            if owner in hot:
                return True
            if self._hot(owner, sketch.estimate(owner)):
                hot.add(owner)
                return True
            return False
        return counts

    def _hot_victims(self, replica: str, new_tokens: int, keep_owner: int,
                     hot_owner: Callable[[int], bool], memo: dict[int, bool]) -> int:
        """Tokens of hot prefixes that admitting ``new_tokens`` would evict there."""
        held = self._models.get(replica)
        if held is None:
            return 0
        return held.model.evicted_tokens(new_tokens, keep_owner, hot_owner, memo)

    # -- what happened ----------------------------------------------------------------------
    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Routed):
            self._routed_to(event.request, event.replica)
        elif isinstance(event, Finished):
            req = event.request
            if event.ok and event.ttft_s is not None and event.cached_tokens is not None:
                self._pace.observe(event.ttft_s, req.prompt_tokens - event.cached_tokens)
            if event.ok and event.duration_s is not None:
                # a slot is held from the prefill's start: the decode, plus the prefill
                hold = event.duration_s
                if event.ttft_s is not None:
                    uncached = req.prompt_tokens - (event.cached_tokens or 0)
                    hold += max(0, uncached) * self._pace.value_s - event.ttft_s
                self._slots.held(max(0.0, hold))
        elif isinstance(event, ReplicaRemoved):
            if self.kv_index is not None:
                self.kv_index.remove_replica(event.replica)
            self._models.pop(event.replica, None)
            self._forget_heads(event.replica)
            self._facts.pop(event.replica, None)
            self._slots.forget(event.replica)
            self._placement.forget_replica(event.replica)
            self._own_load.pop(event.replica, None)
            self._churn.pop(event.replica, None)
            self._sending.pop(event.replica, None)
        elif isinstance(event, ReplicaReset):
            if self.kv_index is not None:
                self.kv_index.clear(event.replica)
            self._sending.pop(event.replica, None)
            self._slots.forget(event.replica)  # a restart may run fewer sequences at once
            held = self._models.get(event.replica)
            if held is not None:
                held.model.clear()
                self._forget_heads(event.replica)

    def _sent(self, replica: str, key: int, now: float | None) -> None:
        """Remember that a prompt of prefix key ``key`` went to ``replica`` at ``now``
        (the 4,096 latest keys there: a key older than the grace only needs forgetting)."""
        sending = self._sending.setdefault(replica, {})
        sending.pop(key, None)  # kept in the order sent
        sending[key] = math.inf if now is None else now
        if len(sending) > 4096:
            for old in list(sending)[:2048]:
                del sending[old]

    def _sending_now(self, replica: str, key: int, now: float | None) -> bool:
        """Whether a prompt of prefix key ``key`` went to ``replica`` within the last
        ``kv_event_grace_s`` (its blocks may not be stored there yet)."""
        sent = self._sending.get(replica, {}).get(key)
        if sent is None:
            return False
        return now is None or sent == math.inf or now - sent < self.config.kv_event_grace_s

    def _forget_heads(self, replica: str, evicted: Sequence[int] | None = None) -> None:
        """Drop ``replica`` from the head index: for the ``evicted`` keys, or for every
        head when its model was emptied."""
        heads = self._heads
        keys = list(heads) if evicted is None else evicted
        for key in keys:
            holders = heads.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del heads[key]

    def _model(self, replica: str) -> ReplicaCacheModel:
        """The replica's model, emptied on a new epoch and sized to its latest capacity."""
        cfg = self.config
        epoch, capacity = self._facts.get(replica, (0, None))
        size = int((capacity or cfg.default_capacity_tokens) * cfg.capacity_fraction)
        held = self._models.get(replica)
        if held is None or held.epoch != epoch:
            if held is not None:
                self._forget_heads(replica)
            held = self._models[replica] = _Model(ReplicaCacheModel(size), epoch)
        elif held.model.capacity != size:
            self._forget_heads(replica, held.model.resize(size))
        return held.model

    def _routed_to(self, request: RouteRequest, replica: str) -> None:
        cfg = self.config
        prep = self._prepare(request)
        self._memo = None  # the counts below change what _prepare would say
        model = self._model(replica)
        uncached = max(0, request.prompt_tokens - model.match(prep.chain))
        chain: Sequence[ChainEntry] = prep.chain
        if chain:
            self._heads.setdefault(chain[0].key, set()).add(replica)
        if self.kv_index is not None:
            self._sent(replica, prep.key, request.arrival_s)
        memo = self._index_memo
        if memo is not None and memo[0] is request:
            if memo[1]:
                self._index_agrees = True
            else:
                self._unmatched += 1
            self._index_memo = None
        self._forget_heads(replica, model.admit(chain, prep.key))
        self._sketch.add(prep.key)
        now = request.arrival_s
        if now is not None:
            self._all_load.add(now, uncached)
            self._requests.add(now, 1.0)
            own = self._own_load.get(replica)
            if own is None:
                own = self._own_load[replica] = DecayedRate(cfg.load_window_s)
            own.add(now, uncached)
            if self._sketch.halvings:
                self._judged += 1
                self._judged_load.add(now, uncached)
                if not self._hot(prep.key, prep.seen):
                    self._rare_load.add(now, uncached)
            self._resize_scratch(now)
        learner = self._learner
        if learner is not None and request.affinity_key is None:
            # the learner counts common_lookahead pieces past the prefix it has learned (a
            # longer one is learned a step at a time), not a whole long prompt
            pieces = len(prep.units) // 4
            n = min(pieces, learner.depth + cfg.common_lookahead)
            if self._chain_digests:
                learner.observe_digests(prep.chain.keys(learner.boundaries(n, pieces)),
                                        request.fingerprint)
            else:
                learner.observe(prep.units, n, pieces, request.fingerprint)
        self._routed += 1
        self._mean_prompt += (request.prompt_tokens - self._mean_prompt) / min(
            self._routed, 1024)
        if self._routed % 256 == 0:
            fleet_tokens = sum(h.model.capacity for h in self._models.values())
            self._sketch.window = self._window(fleet_tokens)
        if self._routed % self._sketch.window == 0:
            self._placement.prune(lambda key: self._hot(key, self._sketch.estimate(key)))
            ids, weights, up, in_scratch = self._eligible
            # the replicas of the last hot decision, less those removed since
            facts = self._facts
            up = [u and rid in facts for u, rid in zip(up, ids, strict=True)]
            in_scratch = {i for i in in_scratch if up[i]}
            ring, owners = self._rings.layout(ids, weights)
            self._placement.assign(self._order_of(ids, ring.points, owners, len(ring),
                                                  up, in_scratch),
                                   self._eligible_ids(ids, up, in_scratch), self._room,
                                   self._overflow(ids, ring.points, owners, len(ring),
                                                  up, in_scratch))

    def _fleet_scale(self) -> float:
        """1 / this gateway copy's share of the fleet's prefill: the replicas' own counters
        (every copy's traffic) over what this copy routed, between 1 and 16. A rare prefix's
        admission counts that many times over in its eviction charge, since the other
        copies send their share of such churn there too."""
        fleet, now = self._fleet_prefill, self._all_load.last
        if fleet is None or now is None or self._routed < self._sketch.window:
            return 1.0
        own = self._all_load.rate(now)
        return min(16.0, max(1.0, fleet / own)) if own > 0 else 1.0

    def _window(self, fleet_tokens: int) -> int:
        """Adds between halvings: ``window_factor`` x the prefixes the fleet can hold."""
        cfg = self.config
        keys = fleet_tokens / self._mean_prompt if self._mean_prompt > 0 else 0.0
        return int(min(cfg.sketch_width // 8, max(256, cfg.window_factor * keys)))

    def _resize_scratch(self, now: float) -> None:
        """``S`` from the rare prefill load in replicas, with a quarter replica of
        hysteresis so the set does not flap at a boundary; it grows by one replica at a
        time, at most once per sketch window of routed requests."""
        cfg = self.config
        every = self._judged_load.rate(now)
        if every <= 0 or self._judged < _JUDGED_MIN:
            # until the sketch has seen a window every prefix looks rare, and the first
            # few judged after it say little about the rare share
            return
        rare = self._rare_load.rate(now)
        if self._fleet_prefill is not None:
            # the replicas' own counters see every gateway copy's traffic: the rare share
            # of what this copy routed, times the fleet's prefill rate
            rare = rare / every * self._fleet_prefill
        replicas = max(1, len(self._facts))
        limit = max(cfg.min_scratch, int(cfg.max_scratch_fraction * replicas))
        need = rare * self._pace.value_s / cfg.scratch_utilization
        # the hot prefixes placed need this many replicas' caches: a scratch set that
        # leaves fewer sheds hot hits, so it runs hotter (up to max_scratch_utilization)
        # (its own hysteresis: it shrinks once the hotter load is a quarter replica under
        # one replica less, so the set does not flap where that load crosses a whole one)
        hottest: float | None = None
        if self._mean_room > 0:
            spare = replicas - math.ceil(self._placement.total_tokens / self._mean_room)
            if need > spare:
                hottest = rare * self._pace.value_s / cfg.max_scratch_utilization
                need = max(float(spare), hottest)
        size = self._scratch_size
        if need > size:
            # one replica at a time, a sketch window of routed requests apart: early in a
            # run the rare load reads high (prefixes not yet counted hot, caches still
            # filling), and a set grown to it at once shrank again, moving the homes of
            # the replica in between both times
            if self._routed - self._grown_at < self._sketch.window:
                return
            self._grown_at = self._routed
            size += 1
        elif hottest is not None:
            if hottest <= size - 1.25:
                size = max(spare, math.ceil(hottest))
        elif need < size - 1.25:
            size = math.ceil(need + 0.25)
        self._scratch_size = max(cfg.min_scratch, min(limit, size))

    def describe(self) -> dict[str, object]:
        return {
            "scratch_size": self._scratch_size,
            "fleet_scale": self._fleet_scale(),
            # the replicas' counters show well over what this copy sent: nothing changes
            # then (hot homes depend on the hot set alone, and each model is aged by the
            # others' prefill), but an operator may want to know
            "other_gateway_copies": self._fleet_scale() > 1.4,
            "placed_hot_keys": len(self._placement),
            "placed_hot_tokens": {rid: self._placement.tokens_on(rid) for rid in self._facts},
            "prefill_s_per_token": self._pace.value_s,
            "pace_samples": self._pace.samples,
            "slot_hold_s": self._slots.hold_s,
            "slots": {rid: self._slots.limit(rid) for rid in self._facts},
            "sketch_window": self._sketch.window,
            "common_prefix_chunks": self._learner.depth if self._learner else 0,
            "model_tokens": {rid: held.model.used for rid, held in self._models.items()},
            "model_capacity": {rid: held.model.capacity for rid, held in self._models.items()},
            "kv_event_replicas": [] if self.kv_index is None else self.kv_index.replicas(),
            # the index held blocks but no prompt matched them: the gateway's tokenizer is
            # likely not the engines', and the cache model is used instead
            "kv_events_unmatched": not self._index_agrees
            and self._unmatched >= _UNMATCHED_LIMIT,
        }

    def check_integrity(self) -> None:
        for held in self._models.values():
            held.model.check_integrity()
        self._placement.check_integrity()
        for key, holders in self._heads.items():
            for replica in holders:
                owner = self._models.get(replica)
                if owner is None or key not in owner.model:
                    raise AssertionError(f"cost: head {key} indexed on {replica!r}, which "
                                         "does not hold it")
