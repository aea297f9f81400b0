"""What one gateway believes each replica's prefix cache holds: a ``ReplicaCacheModel`` per
replica (an LRU of the prompt chains sent there, within the replica's KV capacity and
``MAX_MODEL_TOKENS``), and an index from each chain's first entry to the models holding
it, so a decision only matches a prompt against the replicas that may hold its start.

A prompt sent is admitted pending (``ReplicaCacheModel``), remembered by its try's ``sent``
id: taken back (``unadmit``) when the replica refuses it before taking it, let stand
(``settle``) when the request ends, goes elsewhere after a try that may have reached the
replica, or is the oldest of too many (``_PENDING_KEYS_KEPT``).

A model is emptied when its replica restarts (a new epoch) and resized with its scraped
capacity. It is aged by the prefill the replica did that this gateway did not send (other
gateway copies', or clients bypassing it): the replica's prefill counter's rate over what
this copy routed there uncached, entered as entries no prefix owns (``_CHURN_BLOCK``
tokens each), so the model evicts as the replica does. (Each copy modelling only its own
sends gave two copies 0.58 token hit rate where one gets 0.69: their models kept documents
the other copy's traffic had evicted.)

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from policies.base import ReplicaView
from policies.cache_model import (
    Brought,
    ChainEntry,
    PromptChain,
    ReplicaCacheModel,
    match_models,
)
from policies.pace import DecayedRate
from policies.ring import stable_hash

_CHURN_BLOCK = 256  # tokens of others' prefill that enter a model as one entry
_CHURN_OWNER = stable_hash(b"kvgate-others-prefill")  # the owner of those entries
# what this copy routed uncached is the model's prediction; a replica's prefill counter up
# to this factor above it is taken as the prediction's error, not as others' traffic
_OWN_MARGIN = 1.25
_HINTS_KEPT = 1 << 14  # prefix keys whose entries held at the last match are kept
# entry keys of pending admissions kept (a few in-flight prompts' worth; the oldest pending
# admission stands once they are more), and pending admissions kept
_PENDING_KEYS_KEPT = 1 << 16
_PENDING_KEPT = 4096
# the most tokens a model holds, whatever size it is given: a scraped KV capacity has no
# upper bound, and one of 10^18 tokens (a foreign server's gauge) made a model that never
# evicted, growing with every distinct prompt. Twice what the exact index keeps of a
# replica of unknown capacity (``kv_index.DEFAULT_BLOCK_LIMIT`` blocks of 16 tokens), past
# any one replica's KV; each entry (about 200 bytes) holds a token at least, most a
# ``block_chunks`` of pieces (about 128 tokens)
MAX_MODEL_TOKENS = 1 << 25


def model_tokens(size: float) -> int:
    """The tokens a model given ``size`` holds: ``MAX_MODEL_TOKENS`` at most."""
    return int(min(size, MAX_MODEL_TOKENS))


class _Model(NamedTuple):
    model: ReplicaCacheModel
    epoch: int


class PendingAdmission(NamedTuple):
    """An admission whose replica may still refuse its prompt."""

    replica: str
    # the entries it brings (``ReplicaCacheModel.admit``'s ``pending``): only the model
    # that holds them is changed by its end (not a new epoch's, nor one emptied since)
    brought: Brought
    owner: int  # the prompt's prefix key
    uncached: int  # what it added to the replica's own load (``own``), at ``now``
    now: float | None
    own: DecayedRate | None  # that load (a replica removed and added again has another)
    rare: bool | None  # the policy's judgement of its prefix (``admit``'s), handed back


class ReplicaModels:
    """The cache models of a fleet's replicas; see the module docstring."""

    __slots__ = ("_aged_at", "_churn", "_churn_key", "_heads", "_hints", "_load_window_s",
                 "_models", "_own_load", "_pending", "_pending_keys")

    def __init__(self, load_window_s: float) -> None:
        self._load_window_s = load_window_s
        self._models: dict[str, _Model] = {}
        self._heads: dict[int, set[str]] = {}  # a chain's first key -> replicas holding it
        self._hints: dict[int, int] = {}  # prefix key -> entries held at its last match
        self._own_load: dict[str, DecayedRate] = {}  # uncached tokens routed, per replica
        self._churn: dict[str, float] = {}  # others' prefill not yet in a model, tokens
        self._aged_at: dict[str, float] = {}  # when each replica's model was last aged
        self._churn_key = 0  # the last churn entry's key
        # by ``sent``, oldest first
        self._pending: OrderedDict[int, PendingAdmission] = OrderedDict()
        self._pending_keys = 0  # keys held in ``_pending``

    @property
    def pending_tries(self) -> int:
        """The pending admissions kept (tries whose end is still to come)."""
        return len(self._pending)

    def get(self, replica: str) -> ReplicaCacheModel | None:
        """The replica's model, if any (of whatever epoch)."""
        held = self._models.get(replica)
        return None if held is None else held.model

    def models(self) -> Iterable[tuple[str, ReplicaCacheModel]]:
        return ((rid, held.model) for rid, held in self._models.items())

    def model(self, replica: str, epoch: int, size: int) -> ReplicaCacheModel:
        """The replica's model, emptied on a new ``epoch`` and sized to ``size`` tokens
        (``MAX_MODEL_TOKENS`` at most)."""
        size = model_tokens(size)
        held = self._models.get(replica)
        if held is None or held.epoch != epoch:
            if held is not None:
                self._forget_heads(replica)
            held = self._models[replica] = _Model(ReplicaCacheModel(size), epoch)
        elif held.model.capacity != size:
            self._forget_heads(replica, held.model.resize(size))
        return held.model

    def matches(self, chain: PromptChain, key: int, replicas: Sequence[ReplicaView],
                index: dict[str, int], up: list[bool], p: int) -> dict[int, int]:
        """Predicted cached tokens of a ``p``-token prompt (``chain``, prefix ``key``) per
        replica index, in the fleet's order: only the healthy replicas whose model, of
        their current epoch, holds the chain's first entry; at most ``p - 1`` each."""
        out: dict[int, int] = {}
        if not chain:
            return out
        holders = self._heads.get(chain.key(0))
        if not holders:
            return out
        models = self._models
        top = p - 1
        # entries held where this prefix was last matched: the first model's hint (mostly
        # right: a document's blocks, then the question's), so it need not bisect
        hints = self._hints
        first = hints.get(key, 0)
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
            hints[key] = hint
        return dict(sorted(out.items()))  # in the fleet's order: ties break the same way

    def admit(self, replica: str, epoch: int, size: int, chain: PromptChain, owner: int,
              prompt_tokens: int, now: float | None, sent: int | None = None,
              rare: bool | None = None) -> int:
        """Enter a ``prompt_tokens``-token prompt sent to ``replica`` at ``now`` into its
        model (``chain``, owned by prefix key ``owner``); returns the tokens of it the model
        did not hold (what the replica prefills). ``sent``, when given, identifies the try
        (one per request at a time: the caller settles the request's try before it, which
        may have reached its replica): the admission is pending until ``unadmit`` or
        ``settle`` names it. ``rare``: whether the policy judged the prompt's prefix rare
        (None: not judged), kept with it for ``unadmit`` to hand back."""
        model = self.model(replica, epoch, size)
        uncached = max(0, prompt_tokens - model.match(chain))
        if chain:
            self._heads.setdefault(chain[0].key, set()).add(replica)
        brought: Brought = []  # (filled only for a pending admission)
        self._forget_heads(replica, model.admit(chain, owner,
                                                None if sent is None else brought))
        own = None
        if now is not None:
            own = self._own_load.get(replica)
            if own is None:
                own = self._own_load[replica] = DecayedRate(self._load_window_s)
            own.add(now, uncached)
        if sent is not None:
            self._pending[sent] = PendingAdmission(replica, brought, owner, uncached, now,
                                                  own, rare)
            self._pending_keys += len(brought)
            while self._pending_keys > _PENDING_KEYS_KEPT or len(self._pending) > _PENDING_KEPT:
                self.settle(next(iter(self._pending)))
        return uncached

    def unadmit(self, sent: int, replica: str) -> PendingAdmission | None:
        """The try ``sent`` to ``replica`` was refused before the replica took its prompt:
        take back its pending admission there (what no other pending admission brings),
        and its prefill from the replica's own load; returns it (None where none was
        pending there: it stood, past the bound or as its request went on). (A pending
        admission of ``sent`` elsewhere stands: that try is over.) A replica restarted or
        removed since keeps its new model (and, removed, its new load) as it is: the
        admission's entries are not there."""
        pending = self._pending.pop(sent, None)
        if pending is None:
            return None
        self._pending_keys -= len(pending.brought)
        held = self._models.get(pending.replica)
        if pending.replica != replica:
            if held is not None:
                held.model.confirm(pending.brought)
            return None
        if held is not None:
            self._forget_heads(replica, held.model.forget(pending.brought))
        if pending.own is not None and pending.now is not None:
            pending.own.take_back(pending.now, pending.uncached)
        return pending

    def settle(self, sent: int) -> PendingAdmission | None:
        """Let the pending admission of try ``sent``, if any, stand (its request ended, or
        went on after a try that may have reached its replica); returns it."""
        pending = self._pending.pop(sent, None)
        if pending is not None:
            self._pending_keys -= len(pending.brought)
            held = self._models.get(pending.replica)
            if held is not None:
                held.model.confirm(pending.brought)
        return pending

    def age(self, views: Iterable[ReplicaView], now: float,
            size_of: Callable[[str], tuple[int, int]]) -> None:
        """Age each replica's model by the prefill it did since its model was last aged
        that this copy did not send (see the module docstring): each replica by its own
        time, since decisions over a tenant's partition see only its replicas.
        ``size_of(replica)``: its (epoch, model size)."""
        aged_at = self._aged_at
        for r in views:
            since = aged_at.get(r.id)
            if since is not None and now <= since:
                # a decision out of arrival order (tokenized on the pool): its time is
                # aged already, and moving the clock back would age it twice
                continue
            aged_at[r.id] = now
            rate = r.prefill_tokens_per_s
            if rate is None or not rate < math.inf or since is None:
                continue  # (NaN or inf, from a foreign server's counters: unknown)
            dt = now - since
            own = self._own_load.get(r.id)
            others = rate - (own.rate(now) * _OWN_MARGIN if own is not None else 0.0)
            if others <= 0:
                continue
            churn = self._churn.get(r.id, 0.0) + others * dt
            if churn >= _CHURN_BLOCK:
                self._churn_key += 1
                model = self.model(r.id, *size_of(r.id))
                self._forget_heads(r.id, model.admit(
                    [ChainEntry(self._churn_key, int(churn))], _CHURN_OWNER))
                churn -= int(churn)
            self._churn[r.id] = churn

    def survival(self, r: ReplicaView, share: float, requests_per_s: float,
                 now: float) -> float:
        """Che's approximation for an LRU cache: the chance that a prefix with ``share`` of
        the fleet's ``requests_per_s`` is asked again before it reaches the LRU end of
        ``r``'s cache, which takes (capacity, plus the room still free) / (tokens the cache
        takes in a second) seconds. Where caches thrash (a hot set larger than the fleet's
        KV) it is low and a queued home is not worth waiting for: the prompt would be
        evicted before its next use anyway."""
        held = self._models.get(r.id)
        inflow = self._inflow(r, now)
        if held is None or inflow <= 0:
            return 1.0
        model = held.model
        turnover = (2 * model.capacity - min(model.used, model.capacity)) / inflow
        return -math.expm1(-share * requests_per_s * turnover)

    def eviction_loss(self, r: ReplicaView, tokens: int, key_rate: float,
                      now: float) -> float:
        """The chance that a hot prefix at the LRU end of ``r``'s cache, asked
        ``key_rate`` times a second, comes back in the time an admission of ``tokens``
        takes off its life. In an LRU cache an entry leaves once the cache has taken in
        its capacity after the entry's last use (Che's approximation), so admitting
        ``tokens`` brings every entry's exit forward by ``tokens`` / the tokens the cache
        takes in a second. A home holding its hot set takes in little: the loss is near 1,
        the victim's next hit. Where the hot set outgrows the caches they take in a prompt
        every few requests: the victim was about to go anyway, and the loss is small.
        1.0 where the rate or the inflow is unknown."""
        inflow = self._inflow(r, now)
        if inflow <= 0 or key_rate <= 0:
            return 1.0
        return -math.expm1(-key_rate * tokens / inflow)

    def _inflow(self, r: ReplicaView, now: float) -> float:
        """Tokens ``r``'s cache takes in a second: its scraped prefill rate, or what this
        gateway sent it where that is more (the scrape lags)."""
        own = self._own_load.get(r.id)
        return max(own.rate(now) if own is not None else 0.0, r.prefill_tokens_per_s or 0.0)

    def hot_victims(self, replica: str, new_tokens: int, keep_owner: int,
                    hot_owner: Callable[[int], bool], memo: dict[int, bool]) -> int:
        """Tokens of hot prefixes (``hot_owner``) that admitting ``new_tokens`` would
        evict from ``replica``'s model, but for ``keep_owner``'s own."""
        held = self._models.get(replica)
        if held is None:
            return 0
        return held.model.evicted_tokens(new_tokens, keep_owner, hot_owner, memo)

    def remove(self, replica: str) -> None:
        """Forget a replica that left the fleet."""
        self._models.pop(replica, None)
        self._forget_heads(replica)
        self._own_load.pop(replica, None)
        self._churn.pop(replica, None)
        self._aged_at.pop(replica, None)

    def reset(self, replica: str) -> None:
        """Empty the model of a replica that restarted (its cache is empty)."""
        held = self._models.get(replica)
        if held is not None:
            held.model.clear()
            self._forget_heads(replica)

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

    def check_integrity(self) -> None:
        for held in self._models.values():
            held.model.check_integrity()
        for key, holders in self._heads.items():
            for replica in holders:
                owner = self._models.get(replica)
                if owner is None or key not in owner.model:
                    raise AssertionError(f"cost: head {key} indexed on {replica!r}, which "
                                         "does not hold it")
        keys = sum(len(p.brought) for p in self._pending.values())
        if keys != self._pending_keys:
            raise AssertionError(f"cost: {self._pending_keys} pending keys counted, "
                                 f"{keys} held by {len(self._pending)} pending admissions")
