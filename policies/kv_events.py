"""``kv_events``: route to the replica with the least work, judged from an exact index of
what each replica caches (fed by the engines' KV events; see ``kv_index``).

For prompt length ``p`` and each healthy replica ``r``::

    overlap[r] = B x (leading prompt blocks r holds),  at most (p - 1) // B blocks
                 (an engine never serves the prompt's last token from cache)
    cost[r]    = (p - overlap[r]) x prefill_weight + queued_tokens[r]

Lowest cost wins, ties at random (never list order); all healthy replicas are ranked by
cost. Reason ``cache_match`` when the winner holds part of the prompt, else ``balance``.
Each score is the replica's cost (lower is better) with its matched tokens.

The policy owns the index; the gateway feeds it (``gateway.kv_event_subscriber``) and tests may feed
it directly. ``choose`` only reads it. ``observe`` clears a replica that restarted and
drops one that left; routing decisions are not recorded as cache (the index is exact).

The index matches token ids, so the gateway must tokenize as the engines do. Whether it
does is judged as ``cost`` judges it (``index_matches.IndexAgreement``): a prompt whose
leading ``TELLING_BLOCKS`` x 2^k blocks went to a replica before (``_SENT_KEPT`` prefixes
remembered), more than ``GRACE_S`` ago, should be held there, and agrees when the index
finds at least half of that much on some replica (matched again at the route, as far as
that takes). Once ``MIN_JUDGED`` prompts are judged and fewer than 1
in ``index_matches.AGREE_SHARE`` of the last ``WINDOW`` agree, ``describe`` says
``kv_events_unmatched`` and a warning is logged (once every ``WARN_EVERY_S`` at most);
the index is read all the same (there is no other word on what a replica caches).

A replica whose KV event stream is judged stalled (``KVIndex.stalled``: a prompt answered
there must have stored blocks, and no message of it came ``STALL_S`` after that prefill)
is taken as holding none of a prompt, ranked by its prefill and queue alone, until a
message comes (``describe``: ``kv_events_stalled``). Its index still claims what the engine
evicted since, and learned nothing it stored since (no message came): holding "only what
was seen since the stall" is holding nothing. Unmatched, a stalled replica is not sent
documents it may no longer hold (load spreads them); its next message clears the stall.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

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
from policies.index_matches import (
    TELLING_BLOCKS,
    IndexAgreement,
    agreement_verdict,
    answered,
    stalled_state,
)
from policies.kv_index import KVIndex
from policies.ring import token_bytes
from policies.size_bounds import check_sizes

log = logging.getLogger(__name__)

# prompts judged before a mismatch is told: enough repeats that a few evicted ones do not
# pass for another tokenizer
MIN_JUDGED = 64
# a prefix sent to a replica this recently may not be stored there yet (its prefill)
GRACE_S = 5.0
# an answered prompt's stores this overdue (after its prefill) stall its replica's stream:
# the grace a prefill may take to show, and as much again for a loaded stream's delivery
STALL_S = 2 * GRACE_S
# prefixes (per sent prompt: its leading TELLING_BLOCKS x 2^k blocks) remembered at most
_SENT_KEPT = 1 << 16
WARN_EVERY_S = 300.0


@dataclass(frozen=True, slots=True)
class KVEventsConfig:
    """See ``presets/kv_events.yaml`` for what each key means."""

    block_size: int = 16
    prefill_weight: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        check_sizes(self)
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size!r}")
        if self.prefill_weight < 0:
            raise ValueError(f"prefill_weight must be >= 0, got {self.prefill_weight!r}")


class KVEvents(Policy):
    """Least prefill-plus-queue cost over an exact per-replica block index."""

    name = "kv_events"
    reasons = ("cache_match", "balance")
    tokens_needed = None

    def __init__(self, config: KVEventsConfig | None = None) -> None:
        self.config = config or KVEventsConfig()
        self.kv_index: KVIndex = KVIndex(self.config.block_size, stall_s=STALL_S)
        self._rng = random.Random(self.config.seed)
        self.agreement = IndexAgreement(MIN_JUDGED)
        # key of a sent prompt's leading blocks -> (replica, when), oldest first
        self._sent: dict[int, tuple[str, float]] = {}
        self._warned_at = -math.inf

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        ok = healthy(replicas)
        bs = self.config.block_size
        p = max(request.prompt_tokens, len(request.tokens))
        max_blocks = max(0, (p - 1) // bs)
        if request.cache_salt is None:
            # a stalled stream's replica is unmatched: its evictions are not in the index
            stalled = self.kv_index.stalled(request.arrival_s)
            blocks = self.kv_index.match(request.tokens,
                                         [r.id for r in ok if r.id not in stalled],
                                         max_blocks, request.model, request.adapter)
        else:
            # KV events carry no salt: the index cannot tell whether this tenant's salted
            # blocks are cached anywhere, so predict no hit rather than a wrong one.
            blocks = {}
        weight = self.config.prefill_weight
        rng = self._rng
        keyed = []
        for r in ok:
            overlap = blocks.get(r.id, 0) * bs
            cost = (p - overlap) * weight + r.queued_tokens
            keyed.append((cost, rng.random(), overlap, r.id))
        keyed.sort()
        best_overlap = keyed[0][2]
        scores = tuple(ReplicaScore(rid, cost, overlap) for cost, _, overlap, rid in keyed)
        return Decision(tuple(rid for *_, rid in keyed),
                        "cache_match" if best_overlap > 0 else "balance", best_overlap, scores)

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Routed):
            self._routed(event.request, event.replica)
        elif isinstance(event, Finished):
            if not self.agreement.mismatched:  # (else nothing it holds is matched)
                answered(self.kv_index, event)  # whether its replica's stream speaks
        elif isinstance(event, ReplicaReset):
            self.kv_index.reset(event.replica)
            self._forget(event.replica)
        elif isinstance(event, ReplicaRemoved):
            self.kv_index.remove_replica(event.replica)
            self._forget(event.replica)

    def describe(self) -> dict[str, object]:
        return {
            "kv_event_replicas": self.kv_index.replicas(),
            # prompts judged lately, and how many found in the index what it should hold
            "kv_events_judged": self.agreement.state(),
            # fewer than 1 in AGREE_SHARE did: the gateway's tokenizer is likely not the
            # engines' (``tokenizer:``), and the index matches next to nothing
            "kv_events_unmatched": self.agreement.mismatched,
            # replicas whose KV event streams went silent though prompts answered there
            # stored blocks: taken as holding none of a prompt until a message comes
            "kv_events_stalled": stalled_state(self.kv_index),
        }

    # -- whether the gateway's tokens are the engines' ------------------------------------
    def _routed(self, request: RouteRequest, replica: str) -> None:
        """Judge ``request`` by the prefixes sent before it, then remember its own as sent
        to ``replica``."""
        now = request.arrival_s
        tokens = request.tokens
        bs = self.config.block_size
        if now is None or request.cache_salt is not None or len(tokens) < TELLING_BLOCKS * bs:
            return
        kv = self.kv_index
        depths = []  # leading blocks: TELLING_BLOCKS x 2^k, at most the prompt's
        d = TELLING_BLOCKS
        while d * bs <= len(tokens):
            depths.append(d)
            d *= 2
        data = token_bytes(tokens[: depths[-1] * bs]).tobytes()
        keys = [hash((request.model, data[: d * bs * 4])) for d in depths]
        expected = 0  # tokens a replica should hold: the deepest prefix sent before
        for d, k in zip(reversed(depths), reversed(keys), strict=True):
            sent = self._sent.get(k)
            if sent is not None:
                rid, at = sent
                if now - at >= GRACE_S and kv.num_blocks(rid):
                    expected = d * bs
                break
        if expected:
            # matched again here (``choose`` keeps nothing), as far as the verdict needs
            half = -(-expected // (2 * bs))
            held = max(kv.match(tokens, kv.replicas(), half, request.model,
                                request.adapter).values(), default=0) * bs
            verdict = agreement_verdict(held, expected, expected, bs)
            if verdict is not None:
                self.agreement.add(verdict)
                if not verdict and self.agreement.mismatched:
                    self._warn()
        sent_map = self._sent
        for k in keys:
            sent_map.pop(k, None)  # kept in the order sent
            sent_map[k] = (replica, now)
        if len(sent_map) > _SENT_KEPT:
            for old in list(sent_map)[: _SENT_KEPT // 2]:
                del sent_map[old]

    def _warn(self) -> None:
        at = time.monotonic()
        if at - self._warned_at < WARN_EVERY_S:
            return
        self._warned_at = at
        state = self.agreement.state()
        log.warning(
            "kv_events: %d of the last %d prompts judged found in the KV-event index what "
            "it should hold; likely cause: the gateway's tokenizer does not produce the "
            "engines' token ids: set tokenizer: to the engines' tokenizer",
            state["agreeing"], state["judged"])

    def _forget(self, replica: str) -> None:
        """What went to a replica that restarted or left is no longer held there."""
        self._sent = {k: v for k, v in self._sent.items() if v[0] != replica}
