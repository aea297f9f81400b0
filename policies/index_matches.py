"""Cached tokens from the replicas' KV events, where they publish them: the exact index
(``kv_index``) in place of the cache model's prediction.

For each replica the index hears from, a prompt's cached tokens are the blocks the index
holds of it; but for a prompt whose prefix key (its document, its conversation) went there
in the last ``grace_s`` (its blocks may not be stored yet), which keeps the larger of the
index's count and the model's. A try its replica refused (``unrouted``) is no send there: the
key's time there goes back to the send before it.

Until a first prompt matches a block in the index, a prompt that matches none keeps the
model's prediction: it may be new, or the gateway's tokens may not be the engines'
(another tokenizer), which no block would ever match. After ``UNMATCHED_LIMIT`` such
prompts that the model says a publishing replica holds (one with blocks in the index,
sent there before the grace), the index is no longer read (``in_use``), and the policy no
longer needs the prompt tokenized. A prompt that matches once settles it the other way
for good.

The index itself is not owned here (per-model policies share one): each call is handed it.
Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.base import ReplicaView, RouteRequest
from policies.kv_index import KVIndex

# prompts that matched no block the index held, none matching before them, after which the
# gateway's tokens are taken not to be the engines' (another tokenizer): the index is no
# longer read
UNMATCHED_LIMIT = 1024
# prefix keys remembered per replica at most: those sent within the grace (a key past it is
# forgotten at the replica's next send), fewer where more than this went there in a grace
_SENT_KEPT = 4096


class IndexMatches:
    """Whether to read the exact index, and what it says; see the module docstring."""

    __slots__ = ("_agrees", "_grace_s", "_memo", "_sending", "_unmatched")

    def __init__(self, grace_s: float) -> None:
        if not grace_s > 0:  # (``routed`` keeps the key just sent: it is within the grace)
            raise ValueError(f"grace_s must be > 0, got {grace_s!r}")
        self._grace_s = grace_s
        # replica -> prefix key routed there -> when, and when before that (None: not
        # before), which a refusal of the last send puts back (the blocks it stores are
        # not in the index until its prefill is done)
        self._sending: dict[str, dict[int, tuple[float, float | None]]] = {}
        self._unmatched = 0
        self._agrees = False  # a prompt matched: the gateway's tokens are the engines'
        self._memo: tuple[RouteRequest, bool] | None = None  # the last matches: matched?

    def in_use(self, kv: KVIndex | None) -> bool:
        """Whether ``kv`` is read: it has heard from a replica, and the gateway's tokens
        are not known to be other than the engines'."""
        return kv is not None and kv.fed and (self._agrees or self._unmatched < UNMATCHED_LIMIT)

    @property
    def given_up(self) -> bool:
        """The index held blocks but no prompt matched them: the gateway's tokenizer is
        likely not the engines', and the cache model is used instead."""
        return not self._agrees and self._unmatched >= UNMATCHED_LIMIT

    def matches(self, kv: KVIndex | None, request: RouteRequest, key: int,
                replicas: Sequence[ReplicaView], up: list[bool], p: int,
                matched: dict[int, int]) -> dict[int, int]:
        """``matched`` (the model's cached tokens per replica index) with the index's for
        each healthy replica it hears from; ``key``: the prompt's prefix key, ``p``: its
        tokens. What this prompt says about the index is taken by ``routed``."""
        if kv is None or not request.tokens or request.cache_salt is not None:
            return matched  # KV events carry no salt: a salted prompt is not found there
        tracked = [i for i, r in enumerate(replicas) if up[i] and kv.tracks(r.id)]
        if not tracked:
            return matched
        bs = kv.block_size
        blocks = kv.match(request.tokens, [replicas[i].id for i in tracked], (p - 1) // bs,
                          request.model, request.adapter)
        now = request.arrival_s
        if any(blocks.values()):
            self._memo = (request, True)
        elif not self._agrees:
            # no prompt has matched yet: a new prompt, or the gateway's tokens are not the
            # engines' (another tokenizer). Only a prompt the model says a publishing
            # replica holds (sent there before the grace, and its index holds blocks) tells
            # the two apart. A new or a short prompt does not, so a burst of them cannot
            # turn the index off.
            if any(matched.get(i, 0) >= bs and kv.num_blocks(replicas[i].id)
                   and not self._sending_now(replicas[i].id, key, now)
                   for i in tracked):
                self._memo = (request, False)
            return matched
        out = dict(matched)
        for i in tracked:
            held = blocks[replicas[i].id] * bs
            if self._sending_now(replicas[i].id, key, now):
                held = max(held, out.get(i, 0))  # sent there lately: maybe not stored yet
            if held:
                out[i] = held
            else:
                out.pop(i, None)
        return dict(sorted(out.items()))  # in the fleet's order: ties break the same way

    def routed(self, kv: KVIndex | None, request: RouteRequest, replica: str,
               key: int) -> None:
        """``request`` (prefix key ``key``) went to ``replica``: remember when, and count
        what its match said about the index."""
        if kv is not None:
            sending = self._sending.setdefault(replica, {})
            before = sending.pop(key, None)  # kept in the order sent
            now = request.arrival_s
            sending[key] = (math.inf if now is None else now,
                            None if before is None else before[0])
            if now is not None:
                # the keys sent before the grace, oldest first, no longer tell anything (as
                # they were, 4,096 keys a replica were kept where no replica publishes KV
                # events, and the index is never read); ``key`` itself stops it
                while now - sending[oldest := next(iter(sending))][0] >= self._grace_s:
                    del sending[oldest]
            if len(sending) > _SENT_KEPT:
                for old in list(sending)[:_SENT_KEPT // 2]:
                    del sending[old]
        memo = self._memo
        if memo is not None and memo[0] is request:
            if memo[1]:
                self._agrees = True
            else:
                self._unmatched += 1
            self._memo = None

    def unrouted(self, replica: str, key: int, now: float | None) -> None:
        """The prompt of prefix key ``key`` routed to ``replica`` at ``now`` (its
        ``routed``) was refused there before the replica took it: the key's time there is
        the send's before it, or none. (Once another prompt of the key went there since,
        that send stands, and the one before it is no longer known.)"""
        sending = self._sending.get(replica)
        sent = None if sending is None else sending.get(key)
        if sending is None or sent is None:
            return
        at = math.inf if now is None else now
        if sent[0] == at:
            if sent[1] is None:
                del sending[key]
            else:
                sending[key] = (sent[1], None)
        elif sent[1] == at:
            sending[key] = (sent[0], None)

    def forget(self, replica: str) -> None:
        """Forget what went to a replica that left or restarted."""
        self._sending.pop(replica, None)

    def _sending_now(self, replica: str, key: int, now: float | None) -> bool:
        """Whether a prompt of prefix key ``key`` went to ``replica`` within the grace (its
        blocks may not be stored there yet)."""
        times = self._sending.get(replica, {}).get(key)
        if times is None:
            return False
        sent = times[0]
        return now is None or sent == math.inf or now - sent < self._grace_s
