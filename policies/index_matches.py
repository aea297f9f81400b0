"""Cached tokens from the replicas' KV events, where they publish them: the exact index
(``kv_index``) in place of the cache model's prediction.

For each replica the index hears from, a prompt's cached tokens are the blocks the index
holds of it; but for a prompt whose prefix key (its document, its conversation) went there
in the last ``grace_s`` (its blocks may not be stored yet), which keeps the larger of the
index's count and the model's. A try its replica refused (``unrouted``) is no send there: the
key's time there goes back to the send before it.

Whether the gateway's tokens are the engines' (``IndexAgreement``) is judged from the
prompts that tell: one the model says a publishing replica holds (sent there before the
grace, at least ``TELLING_BLOCKS`` blocks of it) agrees when the index holds at least half
of that on some replica, and disagrees when it does not; one the model knows nothing of
agrees when the index holds at least ``TELLING_BLOCKS`` blocks and half of it somewhere.
Engines with another tokenizer match at most a short head by chance (a chat header, common
words two vocabularies encode alike), never half of a repeated document; engines with the
same one match a repeat whole unless they evicted it, which the model, whose word the index
corrects, gets wrong now and then but not for most prompts. While at least one in
``AGREE_SHARE`` of the last ``WINDOW`` prompts judged agrees, the index replaces the model's
prediction; else a prompt keeps the larger of the two per replica, unless its own match is
deep (it agrees). Once ``UNMATCHED_LIMIT`` prompts are judged and fewer than that share of
the last ``WINDOW`` agree, the index is no longer read (``in_use``), and the policy no
longer needs the prompt tokenized (so nothing is judged again). A burst of new or short
prompts tells nothing either way.

A replica whose KV event stream is judged stalled (``KVIndex.stalled``: a prompt answered
there must have stored blocks, and no message of it came ``kv_event_grace_s`` x 2 after that
prefill) is read from the model, as a replica without events, until a message comes:
the index would keep claiming what the engine evicted meanwhile. ``answered`` tells the
index of such prompts.

The index itself is not owned here (per-model policies share one): each call is handed it.
Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from policies.base import Finished, ReplicaView, RouteRequest
from policies.kv_index import KVIndex

# prompts judged, the last this many weighed
WINDOW = 1024
# prompts judged before the index may be turned off: a full window
UNMATCHED_LIMIT = WINDOW
# 1 in this many of the prompts judged must agree: engines with another tokenizer agree
# with next to none, and a model wrong about most of what it says a replica holds is rare
AGREE_SHARE = 8
# blocks a prompt must be expected (or found) to hold before it tells: a shorter match may
# be a head two tokenizers encode alike
TELLING_BLOCKS = 4
# prefix keys remembered per replica at most: those sent within the grace (a key past it is
# forgotten at the replica's next send), fewer where more than this went there in a grace
_SENT_KEPT = 4096


def agreement_verdict(held: int, expected: int, matchable: int, block_size: int
                      ) -> bool | None:
    """What one prompt says of the gateway's tokens against the engines': True (they
    agree), False (they do not), None (nothing). ``held``: tokens of it the index holds on
    its best replica; ``expected``: tokens a replica should hold (it was sent there before
    the grace; 0: none known); ``matchable``: the most the index could hold of it."""
    telling = TELLING_BLOCKS * block_size
    if expected >= telling:
        return 2 * held >= expected  # a repeat: at least half of it is found
    if held >= telling and 2 * held >= matchable:
        return True  # deep: no head shared by chance is half a prompt
    return None


def answered(kv: KVIndex, event: Finished) -> None:
    """What ``event``'s answer says of its replica's KV event stream: a prompt answered
    whole there, with no message of the replica since it was sent, whose blocks reach at
    least one past what the index holds there, stored that block (the engine publishes
    it within a step of the prefill): ``KVIndex.unheard``. Only matched when the stream
    was silent since the send, which a stream that speaks seldom is at an answer."""
    request, replica = event.request, event.replica
    tokens = request.tokens
    if not event.ok or request.cache_salt is not None or not tokens:
        return  # no answer (nor prefill, maybe); a salted prompt is never matched
    now = kv.clock()
    # the try's send: its answer's duration back (a retry's is not the request's arrival)
    sent = request.arrival_s if event.duration_s is None else now - event.duration_s
    if sent is None or not kv.silent_since(replica, sent):
        return
    bs = kv.block_size
    p = max(request.prompt_tokens, len(tokens))
    # blocks [0, held) the index holds there, [held, limit) the prefill computed and stored
    limit = min((p - 1) // bs, len(tokens) // bs)
    if limit < 1:
        return
    held = kv.match(tokens, (replica,), limit, request.model, request.adapter)[replica]
    if held < limit:
        # its first token ends the prefill; a whole answer tells no sooner than its end
        prefilled = now if event.ttft_s is None else min(now, sent + event.ttft_s)
        kv.unheard(replica, prefilled)


def stalled_state(kv: KVIndex | None) -> dict[str, dict[str, float]]:
    """The replicas whose KV event streams are judged stalled, for ``/admin/explain``:
    how long each has been silent, and the answered prompts unheard since."""
    if kv is None:
        return {}
    return {rid: {"silent_s": round(stall.silent_s, 3), "answers": stall.answers}
            for rid, stall in sorted(kv.stalled().items())}


class IndexAgreement:
    """The verdicts (``agreement_verdict``) of the last ``WINDOW`` prompts judged, and what
    they say: the index ``agrees`` while at least 1 in ``AGREE_SHARE`` of them do, and is
    ``mismatched`` once ``min_judged`` were judged and fewer do."""

    __slots__ = ("_agreeing", "_verdicts", "min_judged")

    def __init__(self, min_judged: int = UNMATCHED_LIMIT) -> None:
        if not 1 <= min_judged <= WINDOW:
            raise ValueError(f"min_judged must be in [1, {WINDOW}], got {min_judged!r}")
        self.min_judged = min_judged
        self._verdicts: deque[bool] = deque()
        self._agreeing = 0  # True among ``_verdicts``

    def add(self, agrees: bool) -> None:
        verdicts = self._verdicts
        if len(verdicts) == WINDOW:
            self._agreeing -= verdicts.popleft()
        verdicts.append(agrees)
        self._agreeing += agrees

    @property
    def agrees(self) -> bool:
        """At least 1 in ``AGREE_SHARE`` of the prompts weighed agree (one at least)."""
        return self._agreeing > 0 and self._agreeing * AGREE_SHARE >= len(self._verdicts)

    @property
    def mismatched(self) -> bool:
        """``min_judged`` prompts judged, and fewer than 1 in ``AGREE_SHARE`` of the last
        ``WINDOW`` agree: the gateway's tokenizer is likely not the engines'."""
        return len(self._verdicts) >= self.min_judged and not self.agrees

    def state(self) -> dict[str, int]:
        """The window's counts, for ``/admin/explain``."""
        return {"judged": len(self._verdicts), "agreeing": self._agreeing}


class IndexMatches:
    """Whether to read the exact index, and what it says; see the module docstring."""

    __slots__ = ("_grace_s", "_memo", "_sending", "agreement")

    def __init__(self, grace_s: float) -> None:
        if not grace_s > 0:  # (``routed`` keeps the key just sent: it is within the grace)
            raise ValueError(f"grace_s must be > 0, got {grace_s!r}")
        self._grace_s = grace_s
        # replica -> prefix key routed there -> when, and when before that (None: not
        # before), which a refusal of the last send puts back (the blocks it stores are
        # not in the index until its prefill is done)
        self._sending: dict[str, dict[int, tuple[float, float | None]]] = {}
        self.agreement = IndexAgreement()
        self._memo: tuple[RouteRequest, bool] | None = None  # the last matches: its verdict

    def in_use(self, kv: KVIndex | None) -> bool:
        """Whether ``kv`` is read: it has heard from a replica, and the gateway's tokens
        are not known to be other than the engines'."""
        return kv is not None and kv.fed and not self.agreement.mismatched

    @property
    def given_up(self) -> bool:
        """The prompts judged did not find in the index what it should hold: the gateway's
        tokenizer is likely not the engines', and the cache model is used instead."""
        return self.agreement.mismatched

    def matches(self, kv: KVIndex | None, request: RouteRequest, key: int,
                replicas: Sequence[ReplicaView], up: list[bool], p: int,
                matched: dict[int, int]) -> dict[int, int]:
        """``matched`` (the model's cached tokens per replica index) with the index's for
        each healthy replica it hears from; ``key``: the prompt's prefix key, ``p``: its
        tokens. What this prompt says about the index is taken by ``routed``."""
        if kv is None or not request.tokens or request.cache_salt is not None:
            return matched  # KV events carry no salt: a salted prompt is not found there
        # a stalled stream's replica is read from the model: its evictions are not in it
        stalled = kv.stalled(request.arrival_s)
        tracked = [i for i, r in enumerate(replicas)
                   if up[i] and kv.tracks(r.id) and r.id not in stalled]
        if not tracked:
            return matched
        bs = kv.block_size
        blocks = kv.match(request.tokens, [replicas[i].id for i in tracked], (p - 1) // bs,
                          request.model, request.adapter)
        now = request.arrival_s
        # what a replica should hold: the model's word where it was sent before the grace
        # (within it, its blocks may not be stored yet) and its index holds blocks
        expected = max((matched.get(i, 0) for i in tracked
                        if kv.num_blocks(replicas[i].id)
                        and not self._sending_now(replicas[i].id, key, now)), default=0)
        verdict = agreement_verdict(max(blocks.values()) * bs, expected, (p - 1) // bs * bs,
                                    bs)
        if verdict is not None:
            self._memo = (request, verdict)
        if not verdict and not self.agreement.agrees:
            # not known to agree (yet, or any more): the index's word only where it says
            # more than the model's (an accidental head must not make a prompt cold)
            out = dict(matched)
            for i in tracked:
                held = blocks[replicas[i].id] * bs
                if held > out.get(i, 0):
                    out[i] = held
            return dict(sorted(out.items()))
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
            self.agreement.add(memo[1])
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
