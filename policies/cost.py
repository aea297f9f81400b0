"""``cost``: choose the replica with the lowest predicted time to first token, counting
what the admission would evict, with one-off prefixes kept on a small scratch set.

In front of LRU prefix caches (vLLM, SGLang) one home per document tops out early: the
documents seen once churn every cache they pass through and evict the hot ones, and a
single load bound trades hits against the tail. This policy keeps:

* a **cache model** per replica (``replica_models``): an LRU, within the replica's KV
  capacity (``MAX_MODEL_TOKENS`` at most), of the prompt chains this gateway sent there,
  aged by the prefill the replica's counters show that this gateway did not send (other
  gateway copies'); where the replicas publish KV events, their exact index in its place
  (``index_matches``);
* a **frequency sketch** (``frequency``) over prefix keys (a document, a conversation):
  a key seen at least ``hot_min_count`` times lately (decayed) is *hot*, else *rare*;
  one placed on a home stays hot while it keeps ``hot_keep_count`` (hysteresis);
* the fleet's **pace** (``pace``): seconds per prefilled token, learned from first-token
  times, and the recent prefill load of rare prefixes;
* the **scratch set** (``scratch_set``): the few replicas, stable on the ring, where rare
  prefixes go, sized to their prefill load;
* the **homes** of hot prefixes (``placement``).

The prompt is never tokenized: its prefix key (a document, a conversation, an app's system
prompt and tools) and its chain of cache entries are hashes of the ``chunk_chars``-
character pieces the gateway hands over (``prefix_keys``).

Candidates: the replicas the model says hold part of the prompt; for a hot key its homes:
the first is placed by ``placement`` (the first non-scratch replica on the ring walked from
the key whose cache still has room for the hot keys placed before it in key order, or else
the first scratch replica whose cache has room (``placement_overflow``), or else one within
a fair share of them: ring hashing alone overfills some LRU caches and underfills others;
the homes depend on the hot set alone, so every gateway copy agrees on them), the
next ones follow on the ring; one home, or as many as the key's share of the requests
needs (share x replicas x ``hot_spread``: an app's system prompt), and once waiting for
those (the wait, plus the tail term where the first token would come late there) costs
more than ``spill_wait`` prefills of what waiting there saves, up to ``homes`` of them and the
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
    prefill  = prefill_weight x (prompt tokens - predicted cached tokens) x t, the
               prompt's common head (the learned common prefix: ``common_head``) counted
               as cached on every replica
    evict    = eviction_weight x t x (hot tokens the admission would evict from the model,
               but for entries of its own prefix key); rare_eviction_weight for a rare key,
               times the chance that a victim is asked again before it would have left
               the cache anyway (``eviction_survival``: small where the cache thrashes)
    scratch  = scratch_loss x prompt tokens x t, for a hot key on a scratch replica that
               is not its home (the churn there will likely evict it before it is used
               again)
    late     = tail_weight x how far the predicted first token (wait + uncached tokens x
               t) falls past (1 + tail_slack) x prompt tokens x t, what an idle replica
               holding none of the prompt would give: a request that late is in the tail
               round robin's fleet would not have, while a shorter wait costs the tail
               nothing
    score    = wait + prefill + evict + scratch + late     lowest wins; ties in ring order
                                                            (the scratch set's from the key)

Where a replica publishes KV events (``kv_events``), what it holds is known exactly: the
gateway then tokenizes the whole prompt (``tokens_needed`` turns ``None`` once the index
has heard from a replica) and the exact index replaces the model's prediction of cached
tokens for every replica it hears from, until it turns out that the gateway's tokens are
not the engines' (``index_matches``; ``describe``: ``kv_events_unmatched``), and but for a
replica whose stream is judged stalled (``describe``: ``kv_events_stalled``), read from the
model until a message of it comes. The model still predicts what an admission evicts.

A request tried on several replicas counts once in what it says of the traffic (its
prefix's count and judgement, the request rates, the common prefix learned): at its first
try (``CountedRequests``). What each try makes the policy believe of its replica's cache
stays, as the replica may hold or compute the prompt (a try that timed out), but for a try
refused before the replica took the prompt (``Unrouted``), taken back (``_unrouted``).

``/admin/explain`` shows each term per candidate scored (a candidate whose wait, prefill,
scratch and late terms alone exceed the best total is ranked after them unscored). Reasons:
``cache_match`` (the winner is predicted to hold part of the prompt), ``affinity`` (a hot
key on one of its homes, or a rare one on the home whose cache has room), ``scratch`` (a
rare key on the scratch set), ``spill``
(anything else).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
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
    Unrouted,
    healthy,
    usable_capacity,
)
from policies.cache_model import PromptChain
from policies.cost_config import CostConfig
from policies.counted_requests import CountedRequests
from policies.frequency import FrequencySketch
from policies.in_flight_bound import (
    balance_bound,
    in_flight_load,
    in_flight_loads,
    least_loaded,
)
from policies.index_matches import IndexMatches, answered, stalled_state
from policies.kv_index import KVIndex
from policies.pace import DecayedRate, PrefillPace, ReplicaSlowdown
from policies.placement import HotPlacement, Overflow
from policies.prefix_keys import PrefixKeys
from policies.recent_ids import RecentIds
from policies.replica_models import PendingAdmission, ReplicaModels, model_tokens
from policies.request_memo import RequestMemo
from policies.ring import RingCache, walk
from policies.scratch_set import ScratchSet
from policies.slots import DecodeSlots

# a view's fields by position (it is a named tuple): cheaper than by name, once per replica
# per decision
_ID, _WEIGHT, _HEALTHY = (itemgetter(ReplicaView._fields.index(name))
                          for name in ("id", "weight", "healthy"))
_REFRESH_S = 0.25  # arrival seconds between reads of the views' slowly changing gauges
_MEMBERSHIPS_KEPT = 16  # memberships whose last refresh is remembered (as rings are)
# arrival seconds after which a replica no decision's views held is forgotten, as one that
# left: it stopped serving this policy's model (a restart with another, a new deployment)
# while its id stays in the fleet, so no ReplicaRemoved comes. Remembered, it made every
# later decision look like a tenant partition's, and no hot prefix was placed again.
_UNSEEN_S = 600.0
# a prompt this many times a replica's known KV capacity (in the gateway's tokens, within
# the token calibration's ~15%) is one the replica refuses whole (``Cost._refuses``)
OVER_CAPACITY = 1.25


class _Prepared(NamedTuple):
    """What ``choose`` and ``observe`` both derive from one request."""

    key: int
    units: memoryview  # the prompt's chunk hashes as u32 bytes (at most max_chunks)
    chain: PromptChain
    common: int  # pieces of the prompt's head the learned common prefix covers
    seen: int  # the key's decayed count before this request


class _Counted(NamedTuple):
    """What a request's first try judged that its retries count again, at the replicas
    they go to (``Cost._routed_to``)."""

    rare: bool | None  # its prefix judged rare (None: not judged) for the scratch set


class Cost(Policy):
    """Lowest predicted time to first token over a cache model; see the module docstring."""

    name = "cost"
    reasons = ("cache_match", "affinity", "scratch", "spill", "balance")

    def __init__(self, config: CostConfig | None = None) -> None:
        self.config = cfg = config or CostConfig()
        self.chunk_chars = cfg.chunk_chars
        # the pieces read (``prefix_keys``): a longer prompt's others are not hashed
        self.chunks_needed = cfg.max_chunks
        # a replica's stream is stalled once an answered prompt's stores are two graces
        # overdue: one a prefill may take to show, one more for a loaded stream's delivery
        self.kv_index = KVIndex(cfg.kv_block_size, stall_s=2 * cfg.kv_event_grace_s) \
            if cfg.kv_events else None
        self._rings = RingCache(cfg.vnodes)
        self._mean_prompt = 0.0
        self._sketch = FrequencySketch(cfg.sketch_width, cfg.sketch_depth,
                                       window=self._window(0))
        self._pace = PrefillPace(cfg.prefill_s_per_token)
        # each replica's own pace, where clearly slower than the fleet's
        self._slow = None if cfg.slow_replica_ratio is None else ReplicaSlowdown(
            cfg.prefill_s_per_token, cfg.slow_replica_ratio)
        # its slowdown by replica, the slow ones only (the live dict: empty while none is)
        self._slow_factors: dict[str, float] = {} if self._slow is None else self._slow.slow()
        self._slots = DecodeSlots()
        self._all_load = DecayedRate(cfg.load_window_s)  # uncached tokens routed
        self._requests = DecayedRate(cfg.load_window_s)  # requests routed
        self._hot_requests = DecayedRate(cfg.load_window_s)  # of those, for hot keys
        self._models = ReplicaModels(cfg.load_window_s)
        self._exact = IndexMatches(cfg.kv_event_grace_s)  # reads kv_index, where fed
        # id -> (epoch, capacity, scraped prefill tokens/s), as last refreshed
        self._facts: dict[str, tuple[int, int | None, float | None]] = {}
        self._facts_changed = 0  # bumped when a replica joins or leaves ``_facts``
        # id -> arrival when a decision's views (healthy or not) last held it (``_refresh``)
        self._seen_at: dict[str, float] = {}
        # replicas removed from the fleet lately (``ReplicaRemoved``), oldest first, until
        # a decision's views hold one again: a route to one told after its removal (a
        # retry ranked before it, another worker's or copy's route) would give it a model
        # that nothing removes again. Every model's instance shares it (``share_from``): an
        # instance made after the removal was never told of it
        self._left = RecentIds()
        # replicas this model's decisions stopped seeing (``_UNSEEN_S``), until one does
        # again, for late routes alike: this instance's own (another model may still be
        # served there)
        self._unused = RecentIds()
        # (the index dict, _facts_changed) -> whether it leaves a known replica out
        self._partial_memo: tuple[dict[str, int], int, bool] | None = None
        self._fleet_prefill: float | None = None  # scraped prefill tokens/s, all replicas
        self._scratch = ScratchSet(cfg)
        self._routed = 0  # requests routed (a retry not again)
        # the requests counted whose end is not told yet: their next tries are retries
        self._counted: CountedRequests[_Counted] = CountedRequests()
        self._memo: RequestMemo[_Prepared] = RequestMemo()
        self._keys = PrefixKeys(cfg)
        self.wants_fingerprint = self._keys.learner is not None  # it tells repeats apart
        # the replicas of the last hot decision: (ids, weights, healthy, scratch indexes)
        self._eligible: tuple[list[str], list[float], list[bool], set[int]] = (
            [], [], [], set())
        # per membership (its ring): (arrival, healthy count) of its last refresh
        self._refreshed: dict[object, tuple[float, int]] = {}
        self._mean_room = 0.0  # mean of ``_room`` over the replicas seen (``_refresh``)
        # the last order seen: its ids, each id's position, and the positions in id order
        self._index: tuple[list[str], dict[str, int], list[int]] = ([], {}, [])
        self._placement = HotPlacement(cfg.placement_slack or 0.0, cfg.sketch_width // 8)
        # owners known hot since the sketch last halved (counts only grow in between)
        self._hot_owners: tuple[int, set[int]] = (0, set())

    def share_from(self, first: Policy) -> None:
        """Also ``first``'s list of the replicas removed from the fleet lately: an instance
        made after a removal (a model first seen since) kept a late route to the gone
        replica for good. (Which replicas a model stopped using stays each instance's.)"""
        super().share_from(first)
        if isinstance(first, Cost):
            self._left = first._left

    # -- what a request is --------------------------------------------------------------
    @property
    def tokens_needed(self) -> int | None:  # type: ignore[override]
        """None (the whole prompt, to match in the exact index) once some replica's KV
        events reach it; else 0: the prompt's chunk hashes are all this policy reads."""
        return None if self._exact.in_use(self.kv_index) else 0

    @property
    def scratch_size(self) -> int:
        return self._scratch.size

    @property
    def pace_s_per_token(self) -> float:
        return self._pace.value_s

    def _prepare(self, request: RouteRequest) -> _Prepared:
        """Key, chain and count of ``request``, derived once for ``choose`` and the
        ``observe(Routed)`` that follows it."""
        prepared = self._memo.get(request)
        if prepared is None:
            prefix = self._keys.prefix(request)
            prepared = self._memo.put(request, _Prepared(*prefix,
                                                         self._sketch.estimate(prefix.key)))
        return prepared

    def _hot(self, key: int, count: int, scale: float | None = None) -> bool:
        """Whether prefix ``key``, counted ``count`` lately, is hot: ``hot_min_count``, or
        ``hot_keep_count`` once it is placed on a home. Without the lower bar a hot key
        whose count dipped under ``hot_min_count`` at a halving (a few requests a window,
        drawn at random) went to the scratch set and left the placement for a window,
        and the homes of the keys after it were placed again (offline, contracts-400,
        3,900 requests: 62 hot requests missed on a replica other than their document's
        previous one, 46 with it).

        The count is this copy's: one of several gateway copies sees its share of a
        prefix's requests, so its count is scaled by ``_fleet_scale`` to the fleet's before
        the entry bar (offline, contracts-400, 6,000 requests split at random between two
        unpeered copies, seeds 0/1/2: 0.661/0.661/0.660 token hit rate before, 0.675/0.662/
        0.686 with it; one copy unchanged). A copy that learned a key hot later than another
        placed it on a home sent it elsewhere meanwhile. ``scale``: that factor, when the
        caller judges many keys at once."""
        cfg = self.config
        if scale is None:
            scale = self._fleet_scale(settled=False)
        return count * scale >= cfg.hot_min_count or (
            count >= cfg.hot_keep_count and self._placement.home_of(key) is not None)

    def _rare(self, hot: bool) -> bool | None:
        """Whether a prefix ``_hot`` judged ``hot`` counts as rare: judged once the
        sketch has seen a window (before it, every prefix looks rare: None)."""
        return not hot if self._sketch.halvings else None

    # -- the decision ---------------------------------------------------------------------
    def explain(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        """``choose`` over a copy of the placement: a hot key without a home is shown the
        home it would get, not placed (placing it, and every other key again, for a request
        never sent moved other keys' homes and kept it in the placed set until it cooled).
        The replicas that no decision's views held for ``_UNSEEN_S`` are forgotten first, in
        the policy's own state, as a decision at this time would: forgotten in the copy
        alone, the placement put back kept their homes while the rest of the policy had
        let them go (``check_integrity`` failed until the next reassignment)."""
        if request.arrival_s is not None:
            self._forget_unseen(replicas, request.arrival_s)
        kept = self._placement
        self._placement = kept.copy()
        try:
            return super().explain(request, replicas)
        finally:
            self._placement = kept

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        cfg = self.config
        up = list(map(_HEALTHY, replicas))
        n_ok = up.count(True)
        if not n_ok:
            healthy(replicas)  # names the error
        ids = list(map(_ID, replicas))
        weights = list(map(_WEIGHT, replicas))
        ring, owners = self._rings.layout(ids, weights)
        self._refresh(replicas, up, n_ok, request.arrival_s, ring)
        index = self._index_of(ids)
        prep = self._prepare(request)
        p = max(1, request.prompt_tokens)
        scale = self._fleet_scale(settled=False)  # (read once for the decision)
        hot = self._hot(prep.key, prep.seen, scale)
        pace = self._pace.value_s
        points, distinct = ring.points, len(ring)

        scratch = self._scratch.members(points, owners, distinct, up, n_ok,
                                        self._slow_indexes(ids))
        in_scratch = set(scratch)
        waits: dict[int, float] = {}

        def wait_of(i: int) -> float:
            w = waits.get(i)
            if w is None:
                w = waits[i] = self._wait(replicas[i], pace)
            return w

        # candidates, in the order ties are broken by
        candidates: dict[int, None] = {}
        matched = self._models.matches(prep.chain, prep.key, replicas, index, up, p)
        if self._exact.in_use(self.kv_index):
            matched = self._exact.matches(self.kv_index, request, prep.key, replicas, up, p,
                                          matched)
        head = self._common_head(prep, p)
        homes: list[int] = []
        rare_home: int | None = None
        first: int | None = None  # a hot key's placed home (on the scratch set: overflow)
        if hot:
            eligible = n_ok - len(scratch)
            # a prefix carrying more than a replica's share of the requests (an app's
            # system prompt) gets as many homes as its share needs
            share = prep.seen / self._sketch.total if self._sketch.total > 0 else 0.0
            spread = max(1, min(eligible, math.ceil(share * eligible * cfg.hot_spread)))
            first = self._home(prep, p, ids, weights, index, points, owners, distinct, up,
                               in_scratch)
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
            busy = not firsts or (waited > 0.0 and self._home_cost(
                firsts, wait_of, matched, replicas, p, pace) > cfg.spill_wait * pace
                * self._saved_at_home(p, firsts, matched, replicas, share, request.arrival_s))
            candidates.update(dict.fromkeys(homes if busy else firsts))
            if not self._partial(index):  # the placement is the whole fleet's
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
            elif scratch:
                # ties between scratch replicas (idle ones, most often) go by the key, so
                # one-off prefixes spread over the set and gateway copies, each blind to
                # the others' sends between scrapes, do not stack them on its first
                start = prep.key % len(scratch)
                candidates.update(dict.fromkeys(scratch[start:] + scratch[:start]))
        # the replicas holding part of the prompt, in id order counted from the key, not
        # in the fleet's (discovery's answer order): gateway copies break a tie between
        # two holders alike, and one holder is not every prefix's
        held = sorted((i for i, m in matched.items() if m > 0), key=ids.__getitem__)
        if len(held) > 1:
            start = prep.key % len(held)
            held = held[start:] + held[:start]
        candidates.update(dict.fromkeys(held))
        # none may hold requests in flight past the balance bound while another is under it
        # (``policies.in_flight_bound``): the least loaded replica takes the request then
        balanced = -1
        factor, floor = cfg.balance_factor, cfg.balance_requests
        early = cfg.early_balance_requests
        if early is not None and early < floor and self._slots.blind:
            floor = early  # nothing known of the slots yet: requests in flight alone
        balance: tuple[float, int] | None = None  # (the bound, the least loaded), once read

        def past_bound(i: int) -> bool:
            nonlocal balance
            load = in_flight_load(replicas[i])
            if factor is None or load <= floor:  # (no pass over the fleet then)
                return False
            if balance is None:
                n = len(replicas)
                by_id = self._index[2] if len(self._index[2]) == n else range(n)
                loads = in_flight_loads(replicas)
                least = least_loaded(loads, up, by_id, prep.key % n)
                balance = (balance_bound(loads[least], factor, floor), least)
            return load > balance[0]

        over = [i for i in candidates if past_bound(i)]
        for i in over:
            del candidates[i]
        if over and not candidates and balance is not None:
            balanced = balance[1]
            candidates[balanced] = None

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
        now = request.arrival_s
        # a hot prefix's requests a second, on average: how soon a victim would be back
        victim_rate = self._hot_requests.rate(now) / len(self._placement) \
            if cfg.eviction_survival and not hot and now is not None and len(self._placement) \
            else 0.0
        churn_scale = 1.0 if hot or not evicts else self._fleet_scale()
        hot_owner = self._hot_owner(scale)
        placement = self._placement
        placing = len(placement) > 0
        inf = math.inf
        slowdown = self._slowdown

        def score(batch: list[int], first_order: int) -> None:
            nonlocal best_total
            bounds: list[tuple[float, int, int, float, float, float, float]] = []
            for order, i in enumerate(batch, first_order):
                w = replicas[i].weight
                t = pace * slowdown(ids[i]) / w if w > 0 else inf
                wait = wait_of(i)
                m = matched.get(i, 0)
                uncached = (p - m) * t
                # (the common head, prefilled once for every later prompt, is weighed as
                # held; the first token comes after it all the same)
                prefill = ((p - head) * t if head > m else uncached) * prefill_weight
                misplaced = misplaced_p * t if hot and i in in_scratch and i != first else 0.0
                # past the first token an idle replica (of this one's pace) would give the
                # whole prompt uncached, with tail_slack, this request would be in the tail
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
                # where no hot key is placed (a scratch replica, an idle one), the hot
                # entries held came with spills, whose keys' requests go to their homes:
                # evicting them loses no hit there (charged, an idle replica that took one
                # spill early stood idle for good, each admission priced at its victims)
                if evicts and (not placing or placement.tokens_on(replicas[i].id)):
                    m = matched.get(i, 0)
                    churn = p - m if hot else round((p - m) * churn_scale)
                    evict = evict_s * self._models.hot_victims(replicas[i].id, churn,
                                                               prep.key, hot_owner, hot_memo)
                    if evict > 0.0 and victim_rate > 0.0 and now is not None:
                        evict *= self._models.eviction_loss(replicas[i], churn, victim_rate, now)
                total = bound + evict
                if total < best_total:
                    best_total = total
                terms = (("wait_s", wait), ("prefill_s", prefill), ("evict_s", evict),
                         ("scratch_s", misplaced), ("late_s", late))
                scored.append((total, order, i, terms, bound))

        score(list(candidates), 0)
        # the least loaded replicas (a pass over the fleet) are candidates too when the
        # others are busy, unless they cannot win: one not yet a candidate holds nothing
        # of the prompt, so it costs at least its whole prefill (inf where every
        # replica's weight is 0)
        heaviest = max(weights)
        if busy and (not scored or (heaviest > 0
                     and best_total > cfg.prefill_weight * (p - head) * pace / heaviest)):
            least, least_outside = self._least_loaded(replicas, up, in_scratch, prep.key)
            extra = [least] if least not in candidates else []
            if hot and in_scratch and least_outside not in candidates \
                    and least_outside != least:
                extra.append(least_outside)
            extra = [i for i in extra if not past_bound(i)]
            if not extra and not scored and balance is not None:
                # every candidate was past the bound, and so were these: the least loaded
                balanced = balance[1]
                extra = [balanced]
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
        if best == balanced:
            reason = "balance"
        elif matched.get(best, 0) > 0:
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

    def _common_head(self, prep: _Prepared, p: int) -> int:
        """Tokens of the prompt's head that the prefill term counts as held on every
        replica (``common_head``): the learned common prefix (a system prompt most traffic
        shares), short of the whole prompt. A replica without it prefills it once, then
        holds it for every later prompt that shares it: charged to the one request that
        brings it, new conversations stayed on the replicas that held it first while the
        others stood idle, their caches unused."""
        if not prep.common or not self.config.common_head:
            return 0
        return max(0, min(p - 1, round(prep.common * prep.chain.unit_tokens)))

    def _home_cost(self, firsts: list[int], wait_of: Callable[[int], float],
                   matched: dict[int, int], replicas: Sequence[ReplicaView], p: int,
                   pace: float) -> float:
        """Seconds that waiting at a hot key's first homes costs: the wait, plus the tail
        term where the first token would come late there (a prompt the home lost, queued
        behind others), at the home where that is least."""
        cfg = self.config
        best = math.inf
        for i in firsts:
            w = replicas[i].weight
            t = pace * self._slowdown(replicas[i].id) / w if w > 0 else math.inf
            wait = wait_of(i)
            over = wait + (p - matched.get(i, 0) - (1.0 + cfg.tail_slack) * p) * t
            best = min(best, wait + cfg.tail_weight * over if over > 0.0 else wait)
        return best

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
        return held + (p - held) * self._models.survival(replicas[firsts[0]], share,
                                                         self._requests.rate(now), now)

    def _partial(self, index: dict[str, int]) -> bool:
        """Whether a decision's replicas (``index``) leave out a replica this policy knows
        (seen healthy, not removed): a tenant's partition, not the fleet."""
        memo = self._partial_memo
        if memo is not None and memo[0] is index and memo[1] == self._facts_changed:
            return memo[2]
        partial = any(rid not in index for rid in self._facts)
        self._partial_memo = (index, self._facts_changed, partial)
        return partial

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
                used = 0 if held is None else held.used
                room = self._room(rid)
                return i if max(used, self._placement.tokens_on(rid)) + p <= room else None
        return None

    def _refresh(self, replicas: Sequence[ReplicaView], up: list[bool], n_ok: int,
                 now: float | None, membership: object) -> None:
        """Take the replicas' epochs, capacities, slot gauges and prefill rates from the
        healthy views (``up``, ``n_ok`` of them): for each ``membership`` (the fleet, a
        tenant's partition: its ring), at most every ``_REFRESH_S`` of arrival time (they
        change with scrapes, a second or more apart), and whenever the healthy count
        changes. (Throttled over all memberships at once, a partition whose decisions
        followed another's within that time was never refreshed.) The replicas no
        decision's views held for ``_UNSEEN_S`` are forgotten then."""
        memo = self._refreshed
        last = memo.pop(membership, None)  # put back last: the memberships used lately
        if now is not None and last is not None and last[1] == n_ok \
                and 0.0 <= now - last[0] < _REFRESH_S:
            memo[membership] = last
            return
        if now is not None:
            memo[membership] = (now, n_ok)
            if len(memo) > _MEMBERSHIPS_KEPT:
                del memo[next(iter(memo))]
        if now is not None:
            self._forget_unseen(replicas, now)
        ok = list(compress(replicas, up))
        facts = self._facts
        for r in ok:
            if r.id not in facts:
                self._facts_changed += 1
                self._left.discard(r.id)
                self._unused.discard(r.id)
            # a capacity that tells nothing (``usable_capacity``), or a rate that is no
            # number (a foreign server's gauges), is taken as unknown: a negative capacity
            # failed every route there, an infinite one every decision
            rate = r.prefill_tokens_per_s
            facts[r.id] = (r.epoch, usable_capacity(r.kv_capacity_tokens),
                           rate if rate is not None and 0.0 <= rate < math.inf else None)
        self._slots.saw_all(ok)
        if now is not None:
            self._models.age(ok, now, self._model_size)
        # every known replica's latest rate (a partition's views hold only its own)
        rates = [fact[2] for fact in facts.values()]
        self._fleet_prefill = None if None in rates else sum(rates)  # type: ignore[arg-type]
        rooms = [self._room(rid) for rid in facts]
        self._mean_room = sum(rooms) / len(rooms) if rooms else 0.0

    def _forget_unseen(self, replicas: Sequence[ReplicaView], now: float) -> None:
        """Note that ``replicas`` were seen at ``now``, and forget those no decision's
        views held for ``_UNSEEN_S`` (see there)."""
        seen = self._seen_at
        for r in replicas:
            seen[r.id] = now
        stale = [rid for rid, at in seen.items() if now - at > _UNSEEN_S]
        for rid in stale:
            self._unused.note(rid)
            self._forget(rid)

    def _index_of(self, ids: list[str]) -> dict[str, int]:
        """Position of each id in ``ids`` (kept for the last order seen)."""
        if self._index[0] != ids:
            self._index = (list(ids), {rid: i for i, rid in enumerate(ids)},
                           sorted(range(len(ids)), key=ids.__getitem__))
        return self._index[1]

    def _home(self, prep: _Prepared, p: int, ids: Sequence[str], weights: Sequence[float],
              index: dict[str, int], points: list[int], owners: list[int], distinct: int,
              up: list[bool], in_scratch: set[int]) -> int | None:
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
            if i >= 0 and up[i] and weights[i] > 0 \
                    and (i not in in_scratch or self.config.placement_overflow):
                return i
        if self._partial(index):
            # a decision over part of the fleet (a tenant's partition): placing the key
            # here would place every hot key again over that part (and the next decision
            # over the whole fleet back): the key's first ring replica there, read only
            for i in walk(points, owners, distinct, prep.key):
                if up[i] and i not in in_scratch:
                    return i
            return None
        home = self._placement.place(
            prep.key, p, self._order_of(ids, points, owners, distinct, up, in_scratch),
            self._eligible_ids(ids, weights, up, in_scratch), self._room,
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
    def _eligible_ids(ids: Sequence[str], weights: Sequence[float], up: list[bool],
                      in_scratch: set[int]) -> set[str]:
        """The replicas a hot key may be homed on: healthy, not scratch, on the ring (a
        weight of 0 is left off it, and a home there was never walked to)."""
        return {rid for i, rid in enumerate(ids)
                if up[i] and weights[i] > 0 and i not in in_scratch}

    def _room(self, replica: str) -> int:
        """Tokens of hot prefixes ``replica``'s cache is taken to hold (within what its
        model may: ``MAX_MODEL_TOKENS``), ``placement_fill`` of its model's size."""
        return int(self._model_size(replica)[1] * self.config.placement_fill)

    def scratch_set(self, replicas: Sequence[ReplicaView]) -> tuple[str, ...]:
        """The ids of the current scratch set over ``replicas``."""
        ring, owners = self._rings.layout([r.id for r in replicas], [r.weight for r in replicas])
        up = [r.healthy for r in replicas]
        members = self._scratch.members(ring.points, owners, len(ring), up, sum(up),
                                        self._slow_indexes([r.id for r in replicas]))
        return tuple(replicas[i].id for i in members)

    def _wait(self, r: ReplicaView, pace: float) -> float:
        """Predicted seconds before ``r`` starts a new prompt: its queue, less the part of
        its oldest unanswered request it is likely through (that request's age, never more
        than its own prefill); or, when longer, the wait for a free decode slot."""
        w = r.weight
        t = pace * self._slowdown(r.id) / w if w > 0 else math.inf
        queue = r.queued_tokens * t - min(r.pending_age_s, r.pending_head_tokens * t)
        if not queue > 0.0:  # NaN too (a weight of 0 and nothing queued), as max(0.0, ·)
            queue = 0.0
        return max(queue, self._slot_wait(r))

    def _slow_indexes(self, ids: Sequence[str]) -> frozenset[int]:
        """The positions in ``ids`` of the replicas weighed at a slower pace, which the
        scratch set passes over."""
        slow = self._slow_factors
        return frozenset(i for i, rid in enumerate(ids) if rid in slow) if slow \
            else frozenset()

    def _slowdown(self, replica: str) -> float:
        """How many times slower than the fleet's pace ``replica`` prefills (1.0 unless
        clearly slower: ``slow_replica_ratio``)."""
        return self._slow_factors.get(replica, 1.0)

    def _slot_wait(self, r: ReplicaView) -> float:
        """Weighted seconds before a decode slot frees on ``r`` for one more request."""
        if self.config.slot_weight <= 0 or not self._slots.known:
            return 0.0
        in_flight = r.in_flight + r.others_in_flight
        return self.config.slot_weight * self._slots.wait_s(r.id, in_flight)

    def _least_loaded(self, replicas: Sequence[ReplicaView], up: list[bool],
                      scratch: set[int], key: int) -> tuple[int, int]:
        """The healthy replicas with the least load (the wait for a decode slot, then the
        queue per unit of weight): over all, and outside ``scratch`` (the first when
        every healthy one is in it). One pass over the fleet.

        Between equally loaded replicas (idle ones, most often) the one over all is a
        scratch replica where there is one: its cache churns already, while a home's
        holds hot prefixes; otherwise ties go to the first in id order counted from
        ``key`` (the prefix key), so one prefix's spills land on one replica and no
        replica takes every prefix's. Taken first in the fleet's order instead, the
        fleet's first replica took most spills and lost the most hot documents (offline,
        LRU engines, 20,000 requests: contracts token hit 0.655 -> 0.664, contracts-400
        0.720 -> 0.725); in id order, not the order the fleet's replicas were added in
        (discovery's answers), so gateway copies spill a prefix to the same replica."""
        inf = math.inf
        best = outside = -1
        best_wait = best_queue = outside_wait = outside_queue = inf
        # a decode-slot wait is only above 0 where the slots are full, and none is known
        # full before a count is learned
        slots_of = self._slots.slots if self._slots.known and self._slots.prior \
            and self.config.slot_weight > 0 else None
        n = len(replicas)
        start = key % n if n else 0
        by_id = self._index[2] if len(self._index[2]) == n else range(n)
        slow = self._slow_factors
        for j in range(start, start + n):  # the hot loop of a decision: kept plain
            i = by_id[j if j < n else j - n]
            if not up[i]:
                continue
            r = replicas[i]
            w = r.weight
            queued = r.queued_tokens * slow.get(r.id, 1.0) if slow else r.queued_tokens
            queue = queued / w if w > 0 else inf
            wait = 0.0
            if slots_of is not None:
                limit = slots_of(r.id)
                if limit and r.in_flight + r.others_in_flight >= limit:
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

    def _hot_owner(self, scale: float) -> Callable[[int], bool]:
        """Whether a cache entry's owner (a prefix key) is hot: ``_hot`` of its count,
        with the owners found hot kept until the sketch halves (counts only grow
        between two halvings); ``scale``: ``_hot``'s, the decision's."""
        sketch = self._sketch
        halvings, hot = self._hot_owners
        if halvings != sketch.halvings:
            hot = set()
            self._hot_owners = (sketch.halvings, hot)

        def counts(owner: int) -> bool:
            if owner in hot:
                return True
            if self._hot(owner, sketch.estimate(owner), scale):
                hot.add(owner)
                return True
            return False
        return counts

    # -- what happened ----------------------------------------------------------------------
    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Routed):
            # a try of the request before this one is over (it may have reached its
            # replica), whatever this one does: else a pending one, were its request's
            # end lost, would stay for a later request under its id to take back
            self._models.settle(id(event.request))
            # (else the route went nowhere, or to a replica this model no longer uses)
            if event.replica not in self._left and event.replica not in self._unused:
                self._routed_to(event.request, event.replica, event.revocable, event.again)
        elif isinstance(event, Unrouted):
            self._unrouted(event.request, event.replica)
        elif isinstance(event, Finished):
            req = event.request
            admitted = self._models.settle(id(req))
            self._counted.ended(req)
            if self.kv_index is not None and self._exact.in_use(self.kv_index):
                answered(self.kv_index, event)  # whether its replica's stream speaks
            uncached = self._uncached(event, admitted)
            if event.ok and event.ttft_s is not None and uncached is not None:
                self._pace.observe(event.ttft_s, uncached)
                # a replica's own pace only from what it surely prefilled: the tokens it
                # told were not cached, or a prompt the model held none of (were the
                # replica holding some, the sample reads faster, never slower)
                # (not a replica gone from this model: it would be kept for good)
                if self._slow is not None and (event.cached_told
                                               or uncached >= req.prompt_tokens) \
                        and event.replica not in self._left \
                        and event.replica not in self._unused:
                    self._slow.observe(event.replica, event.ttft_s, uncached, self._pace)
            if event.ok and event.duration_s is not None:
                # a slot is held from the prefill's start: the decode, plus the prefill
                hold = event.duration_s
                if event.ttft_s is not None:
                    if uncached is None:
                        uncached = req.prompt_tokens - (event.cached_tokens or 0)
                    hold += max(0, uncached) * self._pace.value_s \
                        * self._slowdown(event.replica) - event.ttft_s
                self._slots.held(max(0.0, hold))
        elif isinstance(event, ReplicaRemoved):
            # the next decision reads its views again, however soon: one added back under
            # this id is known from it (throttled, it was not for up to _REFRESH_S)
            self._refreshed.clear()
            if self.kv_index is not None:
                self.kv_index.remove_replica(event.replica)
            self._left.note(event.replica)
            self._forget(event.replica)
        elif isinstance(event, ReplicaReset):
            # the next decision reads the new epoch, however soon: routed before it was
            # read, a prompt went into the old process's model, dropped at the next read
            self._refreshed.clear()
            if self.kv_index is not None:
                self.kv_index.reset(event.replica)
            self._exact.forget(event.replica)
            if not event.cache_only:  # (a flush leaves the process and its device)
                self._slots.forget(event.replica)  # a restart may run fewer at once
                if self._slow is not None:  # (or run on another device)
                    self._slow.forget(event.replica)
            self._models.reset(event.replica)

    @staticmethod
    def _uncached(event: Finished, admitted: PendingAdmission | None) -> int | None:
        """The tokens the finished request's replica prefilled: the prompt less the cached
        tokens its usage told, or, where it told none (vLLM without
        ``--enable-prompt-tokens-details``, SGLang without ``--enable-cache-report``: a
        usage that counts 0 cached whatever the replica held), what the cache model
        predicted when the request was routed there. None where neither is known.
        Counting every prompt whole there, a cache hit read as a fast prefill: offline
        (``contracts-400``, 3,888 requests), the learned pace fell to a fraction of the
        true one and the p95 rose from 0.433 to 0.589 s."""
        if event.cached_tokens is not None and event.cached_told:
            return event.request.prompt_tokens - event.cached_tokens
        if admitted is not None and admitted.replica == event.replica:
            return admitted.uncached
        return None

    def _forget(self, replica: str) -> None:
        """Keep nothing of ``replica`` (it left, or stopped serving this policy's model;
        the caller notes which, so that no route told to it later is kept either, until a
        decision's views hold it again). (The KV event index is the caller's: it is kept
        per replica for every model.)"""
        self._seen_at.pop(replica, None)
        self._models.remove(replica)
        if self._facts.pop(replica, None) is not None:
            self._facts_changed += 1
        self._slots.forget(replica)
        self._placement.forget_replica(replica)
        self._exact.forget(replica)
        if self._slow is not None:
            self._slow.forget(replica)

    def _model_size(self, replica: str) -> tuple[int, int]:
        """The replica's epoch, and the tokens its model holds: ``capacity_fraction`` of its
        latest capacity, ``MAX_MODEL_TOKENS`` at most (``model_tokens``)."""
        cfg = self.config
        epoch, capacity, _ = self._facts.get(replica, (0, None, None))
        return epoch, model_tokens((capacity or cfg.default_capacity_tokens)
                                   * cfg.capacity_fraction)

    def _refuses(self, replica: str, prompt_tokens: int) -> bool:
        """Whether ``replica`` refuses a prompt this long: vLLM and SGLang answer 400 to
        one their whole KV cache cannot hold. Only past a known capacity by more than the
        token calibration's error (``OVER_CAPACITY``): an estimate of a capacity it was
        not told says nothing of what the replica takes."""
        capacity = self._facts.get(replica, (0, None, None))[1]
        return capacity is not None and prompt_tokens > capacity * OVER_CAPACITY

    def _routed_to(self, request: RouteRequest, replica: str, revocable: bool,
                   again: bool) -> None:
        """``request`` is sent to ``replica``. What the replica is predicted to hold and
        prefill is counted per try (a ``revocable`` try it refuses is taken back:
        ``_unrouted``); what the request says of the traffic (its prefix's count, request
        rates, the scratch set's judgement, the common prefix learned) at its first try
        alone: a later ``Routed`` of it, after a refusal or a try that may have reached
        its replica, is a retry (``CountedRequests``), as is a told one ``again`` (judged
        rare or hot on its prefix's count now, less its first try's add: requests of the
        prefix between the two tries count)."""
        if self._refuses(replica, request.prompt_tokens):
            return  # nothing of it cached, evicted or prefilled there, nor a prefix's use
        retry = self._counted.retried(request)
        prep = self._prepare(request)
        if retry is None and again:  # another copy's or worker's retry: its first try,
            # a told one, kept nothing here; its prefix is judged on its count less that
            # try's add
            retry = _Counted(self._rare(self._hot(prep.key, max(0, prep.seen - 1))))
        self._memo.clear()  # the counts below change what _prepare would say
        now = request.arrival_s
        hot = False
        if retry is None:
            self._sketch.add(prep.key)
            hot = self._hot(prep.key, prep.seen)
            rare = self._rare(hot)
            if revocable:  # (else no retry nor end of it is told)
                self._counted.counted(request, _Counted(rare))
        else:
            rare = retry.rare  # judged at its first try
        # pending until the replica takes it: a refusal (``Unrouted``) names the request
        # object this ``Routed`` carried (a route that cannot be taken back stands)
        uncached = self._models.admit(replica, *self._model_size(replica), prep.chain, prep.key,
                                      request.prompt_tokens, now,
                                      sent=id(request) if revocable else None, rare=rare)
        self._exact.routed(self.kv_index, request, replica, prep.key)
        if now is not None:
            self._all_load.add(now, uncached)  # (the sum of the replicas' own loads)
            if rare is not None:
                self._scratch.judged(now, uncached, rare, again=retry is not None)
        if retry is not None:
            return  # the same request again, counted at its first try
        if now is not None:
            self._requests.add(now, 1.0)
            if hot:
                self._hot_requests.add(now, 1.0)
            self._scratch.resize(now, self._routed, self._sketch.window, self._fleet_prefill,
                                 self._pace.value_s, len(self._facts),
                                 self._placement.total_tokens, self._mean_room)
        self._keys.learn(request, prep.units, prep.chain)
        self._routed += 1
        self._mean_prompt += (request.prompt_tokens - self._mean_prompt) / min(
            self._routed, 1024)
        if self._routed % 256 == 0:
            fleet_tokens = sum(model.capacity for _, model in self._models.models())
            self._sketch.window = self._window(fleet_tokens)
        if self._routed % self._sketch.window != 0:
            self._placement.advance()  # a bounded share of the window's placement, if any
        else:
            scale = self._fleet_scale(settled=False)
            self._placement.prune(
                lambda key: self._hot(key, self._sketch.estimate(key), scale))
            ids, weights, up, in_scratch = self._eligible
            # the replicas of the last hot decision, less those removed since
            facts = self._facts
            up = [u and rid in facts for u, rid in zip(up, ids, strict=True)]
            in_scratch = {i for i in in_scratch if up[i]}
            ring, owners = self._rings.layout(ids, weights)
            # placed over this and the next decisions, a bounded number of keys each
            self._placement.begin_assign(
                self._order_of(ids, ring.points, owners, len(ring), up, in_scratch),
                self._eligible_ids(ids, weights, up, in_scratch), self._room,
                self._overflow(ids, ring.points, owners, len(ring), up, in_scratch))

    def _unrouted(self, request: RouteRequest, replica: str) -> None:
        """``replica`` refused ``request``'s try before taking the prompt: what the try made
        the policy believe of the replica goes again (its cache model's admission, its
        prefill in the fleet's loads and the scratch set's, its send in the index's
        grace). What the request says of the traffic stays counted, once: its retry
        counts none of it again (``_routed_to``)."""
        taken = self._models.unadmit(id(request), replica)
        if taken is not None:
            if taken.now is not None:
                self._all_load.take_back(taken.now, taken.uncached)
                if taken.rare is not None:
                    self._scratch.take_back(taken.now, taken.uncached, taken.rare)
            self._exact.unrouted(replica, taken.owner, taken.now)

    def _fleet_scale(self, settled: bool = True) -> float:
        """1 / this gateway copy's share of the fleet's prefill: the replicas' own counters
        (every copy's traffic) over what this copy routed, between 1 and 16. A rare prefix's
        admission counts that many times over in its eviction charge, since the other
        copies send their share of such churn there too. ``settled``: 1 until this copy has
        routed a sketch window (the eviction charge waits for a steady rate; a prefix's
        count is scaled from the first scrapes, when a fresh copy learns what is hot)."""
        fleet, now = self._fleet_prefill, self._all_load.last
        if fleet is None or now is None or (settled and self._routed < self._sketch.window):
            return 1.0
        own = self._all_load.rate(now)
        return min(16.0, max(1.0, fleet / own)) if own > 0 else 1.0

    def _window(self, fleet_tokens: int) -> int:
        """Adds between halvings: ``window_factor`` x the prefixes the fleet can hold."""
        cfg = self.config
        keys = fleet_tokens / self._mean_prompt if self._mean_prompt > 0 else 0.0
        return int(min(cfg.sketch_width // 8, max(256, cfg.window_factor * keys)))

    def describe(self) -> dict[str, object]:
        return {
            "scratch_size": self._scratch.size,
            "fleet_scale": self._fleet_scale(),
            # the replicas' counters show well over what this copy sent: nothing changes
            # then (hot homes depend on the hot set alone, and each model is aged by the
            # others' prefill), but an operator may want to know
            "other_gateway_copies": self._fleet_scale() > 1.4,
            "placed_hot_keys": len(self._placement),
            "placed_hot_tokens": {rid: self._placement.tokens_on(rid) for rid in self._facts},
            "prefill_s_per_token": self._pace.value_s,
            "pace_samples": self._pace.samples,
            # replicas weighed at their own, slower pace (slow_replica_ratio): how much
            "slow_replicas": dict(self._slow_factors),
            "slot_hold_s": self._slots.hold_s,
            # learned there, or (not yet seen full) the most learned elsewhere
            "slots": {rid: self._slots.slots(rid) or None for rid in self._facts},
            "sketch_window": self._sketch.window,
            "common_prefix_chunks": self._keys.learner.depth if self._keys.learner else 0,
            "model_tokens": {rid: model.used for rid, model in self._models.models()},
            "model_capacity": {rid: model.capacity for rid, model in self._models.models()},
            # tries sent whose end (refused, or not) is still to come
            "pending_tries": self._models.pending_tries,
            "kv_event_replicas": [] if self.kv_index is None else self.kv_index.replicas(),
            # prompts judged lately, and how many found in the index what it should hold
            "kv_events_judged": self._exact.agreement.state(),
            # too few did: the gateway's tokenizer is likely not the engines', and the
            # cache model is used instead
            "kv_events_unmatched": self._exact.given_up,
            # replicas whose KV event streams went silent though prompts answered there
            # stored blocks: read from the model until a message comes
            "kv_events_stalled": stalled_state(self.kv_index),
        }

    def check_integrity(self) -> None:
        self._models.check_integrity()
        self._placement.check_integrity()
        for rid in (*self._left, *self._unused):  # nothing kept of them (until seen again)
            if rid in self._facts or self._models.get(rid) is not None \
                    or self._placement.tokens_on(rid) or self._slots.limit(rid) is not None:
                raise AssertionError(f"cost: removed replica {rid!r} still has state")
