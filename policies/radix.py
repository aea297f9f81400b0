"""``radix``: route to the replica holding the longest prefix of the prompt, unless that
replica is overloaded (SGLang's ``cache_aware``, with its known faults fixed).

The tree (``radix_tree``) records what this policy sent where, so it approximates each
replica's prefix cache. Decision, for prompt length ``p``:

1. ``matched[r]``: tokens of the prompt replica ``r`` holds. ``shared``: the depth held by
   more than ``shared_fraction`` of the healthy replicas (a system prompt everyone has);
   ``gain[r] = matched[r] - shared``.
2. Candidates: ``gain[r] >= min_match_tokens`` and ``matched[r] / p >= cache_threshold``,
   best gain first, ties at random (never list order).
3. Take the first candidate that is not overloaded, judged for that candidate alone:
   overloaded when ``queued[c] - min_queued > balance_abs_tokens`` and
   ``queued[c] > balance_rel * min_queued``. Reason ``cache_match``.
4. Candidates but all overloaded: least loaded, reason ``spill``; no candidate: least
   loaded, reason ``balance``.

Units: with ``chunk_chars`` > 0 (the default) the tree holds the prompt's chunk hashes
(``prompt_chunks``: ``chunk_chars`` characters each), so the gateway never tokenizes the
prompt for this policy; matches are converted to tokens by the request's
``chunk_tokens``. With ``chunk_chars: 0`` it holds the whole prompt's token ids.

Each replica's share of the tree is capped at ``capacity_fraction`` of its KV capacity in
tokens (``ReplicaView.kv_capacity_tokens``; ``default_capacity_tokens`` where that is
unknown, under 1 token or not finite) and evicted LRU-leaf-first, at once when a snapshot
shows its capacity changed; the whole tree at
``max_tree_mb`` (an estimate, see ``RadixTree.estimated_bytes``). ``observe(Routed)``
learns the epoch and capacity of each healthy replica from the snapshot the decision was
made on (``Routed.replicas``); the tree's entries of a replica belong to the epoch they
were learned in. ``choose`` treats a replica whose view shows another epoch as empty at
once; its entries are dropped at the next ``observe``. A try its replica refused before
taking the prompt (``Unrouted``) is taken back (``RadixTree.take_back``). A route told
after its replica was removed (a retry or send on a decision made before the removal,
another worker's route) is not entered, until a decision's views hold the replica again
(back under its id): ``choose`` notes that, the one state it changes besides its random
generator (and which replicas it last found none of them among, so that decisions over the
same replicas with no removal since look no further).
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from operator import itemgetter

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
from policies.least_load import least_loaded
from policies.radix_tree import Inserted, RadixTree
from policies.recent_ids import RecentIds
from policies.ring import token_bytes
from policies.size_bounds import check_sizes


@dataclass(frozen=True, slots=True)
class RadixConfig:
    """See ``presets/radix.yaml`` for what each key means."""

    cache_threshold: float = 0.3
    min_match_tokens: int = 256
    shared_fraction: float = 0.5
    balance_abs_tokens: int = 16384
    balance_rel: float = 1.5
    default_capacity_tokens: int = 200_000
    capacity_fraction: float = 0.8
    max_tree_mb: float = 256.0
    chunk_chars: int = 64
    seed: int = 0

    def validate(self) -> None:
        check_sizes(self)
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold!r}")
        if not 0.0 <= self.shared_fraction < 1.0:
            raise ValueError(f"shared_fraction must be in [0, 1), got {self.shared_fraction!r}")
        if not 0.0 < self.capacity_fraction <= 1.0:
            raise ValueError(
                f"capacity_fraction must be in (0, 1], got {self.capacity_fraction!r}"
            )
        for key in ("min_match_tokens", "balance_abs_tokens"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if self.default_capacity_tokens < 1:
            raise ValueError(
                f"default_capacity_tokens must be >= 1, got {self.default_capacity_tokens!r}"
            )
        if self.balance_rel < 1.0:
            raise ValueError(f"balance_rel must be >= 1.0, got {self.balance_rel!r}")
        if self.max_tree_mb <= 0:
            raise ValueError(f"max_tree_mb must be > 0, got {self.max_tree_mb!r}")
        if self.chunk_chars < 0:
            raise ValueError(f"chunk_chars must be >= 0, got {self.chunk_chars!r}")


_SENT_KEPT = 4096  # requests whose last insert can be taken back (the oldest's no longer)
_ID = itemgetter(ReplicaView._fields.index("id"))  # a view's id (it is a named tuple)


def _namespace(request: RouteRequest) -> Hashable:
    return (request.model, request.cache_salt)


class Radix(Policy):
    """Approximate radix-tree cache-aware routing; see the module docstring."""

    name = "radix"
    reasons = ("cache_match", "spill", "balance")

    def __init__(self, config: RadixConfig | None = None) -> None:
        self.config = cfg = config or RadixConfig()
        self.chunk_chars = cfg.chunk_chars
        self.tokens_needed = 0 if cfg.chunk_chars > 0 else None
        self._unit_tokens = 1.0
        self._rng = random.Random(cfg.seed)
        self.tree = RadixTree(max_bytes=int(cfg.max_tree_mb * 1024 * 1024))
        self._seen: dict[str, tuple[int, int | None]] = {}  # id -> (epoch, kv capacity)
        self._epochs: dict[str, int] = {}  # id -> epoch the tree's entries belong to
        # id of a request's RouteRequest -> its last try's replica and insert, until the
        # request ends or its replica refuses it (``Unrouted``); the oldest first (a route
        # that is not ``revocable``, another copy's or worker's, stands at once)
        self._sent: OrderedDict[int, tuple[str, Inserted]] = OrderedDict()
        # replicas removed lately (oldest first), until a decision's views hold one again
        # (``choose``; a route's snapshot may be older than the removal): a route told
        # after the removal (a retry, another worker's route) would give it entries that
        # nothing drops again, found if its id comes back
        self._removed = RecentIds()
        # the ids of the last decision's views found to hold none of ``_removed``: the
        # next decision over the same ids finds none either, unless a removal came since
        # (``observe`` lets it go; every instance sharing ``_removed`` is told each one)
        self._clear_views: list[str] | None = None

    def share_from(self, first: Policy) -> None:
        """Also ``first``'s tree: ``max_tree_mb`` bounds the one tree of every model's
        instance (each model's prompts stay apart in it, under their own namespace), not
        each instance's, which made 16 models' trees 16 times the bound."""
        super().share_from(first)
        if isinstance(first, Radix):
            # and what the tree's entries are known by: each replica's epoch and capacity
            # (apart, an instance behind on a restart dropped the entries another had
            # made since, and each cut a replica to its own view of the budget)
            self.tree, self._seen, self._epochs = first.tree, first._seen, first._epochs
            self._removed = first._removed

    def budget(self, replica: str, unit_tokens: float = 1.0) -> int:
        """Units (tokens, or chunks of ``unit_tokens`` tokens) of the tree ``replica`` may
        hold."""
        capacity = self._seen.get(replica, (0, None))[1] or self.config.default_capacity_tokens
        return int(capacity * self.config.capacity_fraction / unit_tokens)

    def _units(self, request: RouteRequest) -> tuple[bytes, float]:
        """The request as the tree stores it, and how many tokens one unit is."""
        if self.chunk_chars > 0 and request.chunks:
            return bytes(token_bytes(request.chunks)), max(request.chunk_tokens, 1e-9)
        return bytes(token_bytes(request.tokens)), 1.0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        cfg = self.config
        if self._removed:  # a decision's views are the fleet: those they hold are back
            ids = list(map(_ID, replicas))
            if ids != self._clear_views:  # (else none of them is in it)
                for rid in ids:
                    self._removed.discard(rid)
                self._clear_views = ids
        ok = healthy(replicas)
        data, unit = self._units(request)
        p = max(1, request.prompt_tokens)
        raw = self.tree.match(_namespace(request), data)
        epochs = self._epochs
        matched = {  # in tokens
            r.id: min(p, round(raw.get(r.id, 0) * unit)) for r in ok
            if epochs.get(r.id, r.epoch) == r.epoch
        }
        depths = sorted(matched.values(), reverse=True)
        need = math.floor(cfg.shared_fraction * len(ok)) + 1  # more than that fraction
        shared = depths[need - 1] if len(depths) >= need else 0
        rng = self._rng
        gains = {rid: m - shared for rid, m in matched.items()}
        candidates = [
            (-gains[r.id], rng.random(), r)
            for r in ok
            if gains.get(r.id, 0) >= max(1, cfg.min_match_tokens)
            and matched[r.id] / p >= cfg.cache_threshold
        ]
        candidates.sort(key=lambda t: (t[0], t[1]))
        min_q = min(r.queued_tokens for r in ok)
        chosen: ReplicaView | None = None
        for _, _, r in candidates:
            q = r.queued_tokens
            if not (q - min_q > cfg.balance_abs_tokens and q > cfg.balance_rel * min_q):
                chosen, reason = r, "cache_match"
                break
        if chosen is None:
            chosen = least_loaded(ok, rng)
            reason = "spill" if candidates else "balance"
        others = sorted(
            (r for r in ok if r.id != chosen.id),
            key=lambda r: (-gains.get(r.id, 0), r.queued_tokens),
        )
        ranked = (chosen.id, *(r.id for r in others))
        scores = tuple(
            ReplicaScore(r.id, float(gains.get(r.id, 0)), matched.get(r.id, 0))
            for r in (chosen, *others)
        )
        return Decision(ranked, reason, matched.get(chosen.id, 0), scores)

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Routed) and event.replica in self._removed:
            # the route went nowhere, whatever its snapshot holds: a send after the removal
            # (a retry) carries the snapshot its decision was made on, from before it
            self._sent.pop(id(event.request), None)
            return
        if isinstance(event, Routed):
            # the snapshot's facts, for the replica routed to and those already known: a
            # snapshot taken before a replica left (a decision, then its removal, then the
            # send) would bring a removed one back for good
            seen = self._seen
            resized = []
            for r in event.replicas:
                if r.healthy and (r.id in seen or r.id == event.replica):
                    before, capacity = seen.get(r.id), usable_capacity(r.kv_capacity_tokens)
                    seen[r.id] = (r.epoch, capacity)
                    if before is not None and before[1] != capacity:
                        resized.append(r.id)
        for rid, (epoch, _) in self._seen.items():
            if self._epochs.setdefault(rid, epoch) != epoch:
                self.tree.drop(rid)
                self._epochs[rid] = epoch
        if isinstance(event, Routed):
            data, unit = self._units(event.request)
            self._unit_tokens = unit
            # a smaller capacity binds at once, not at that replica's next insert
            for other in resized:
                self.tree.evict_replica(other, self.budget(other, unit))
            rid = event.replica
            if rid in self._seen:  # else unknown: no snapshot named it
                self._epochs.setdefault(rid, self._seen[rid][0])
            inserted = self.tree.insert(_namespace(event.request), data, rid,
                                        self.budget(rid, unit))
            self._sent.pop(id(event.request), None)
            if inserted is not None and event.revocable:
                self._sent[id(event.request)] = (rid, inserted)
                if len(self._sent) > _SENT_KEPT:
                    self._sent.popitem(last=False)
        elif isinstance(event, Unrouted):
            # the replica refused the prompt before taking it: it lets go of what the
            # insert brought it (a refusal names the request object its Routed carried)
            sent = self._sent.pop(id(event.request), None)
            if sent is not None and sent[0] == event.replica:
                data, _ = self._units(event.request)
                self.tree.take_back(_namespace(event.request), data, event.replica, sent[1])
        elif isinstance(event, Finished):
            self._sent.pop(id(event.request), None)
        elif isinstance(event, ReplicaRemoved | ReplicaReset):
            self.tree.drop(event.replica)
            if isinstance(event, ReplicaRemoved):
                self._seen.pop(event.replica, None)
                self._epochs.pop(event.replica, None)
                self._removed.note(event.replica)
                self._clear_views = None

    def check_integrity(self) -> None:
        """The tree's invariants, plus every replica within its token budget."""
        self.tree.check_integrity()
        unit = self._unit_tokens  # the unit of the latest insert (tokens or chunks)
        for rid, held in self.tree.tokens.items():
            budget = self.budget(rid, unit)
            assert held <= budget, f"{rid} holds {held} units > budget {budget}"
        for rid in self._removed:  # nothing kept of a replica removed (until seen again)
            assert rid not in self.tree.tokens, f"removed replica {rid!r} holds " \
                f"{self.tree.tokens[rid]} units"
