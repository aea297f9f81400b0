"""``prefix_affinity``: consistent hashing with bounded loads over a prompt-prefix key.

Key: a stable 64-bit hash of (model, cache salt, ``tokens[skip : skip + K]``), or of
(model, cache salt, ``request.affinity_key``) when the request carries one. ``skip`` is the
length of a prefix most traffic shares (a system prompt), learned from traffic (see
``common_prefix``), so such a prefix does not put every request on one key. The window may
end before K (``key_depth``, ``key_rungs``): where what comes back is shorter than K (a
document, then its question), or where a conversation's later turn extends an earlier
window (it takes that one's key).

Units: with ``chunk_chars`` > 0 (the default) the key hashes the prompt's pieces
(``prompt_chunks``: hashes of ``chunk_chars`` characters, or of 16 token ids when the
prompt comes as ids), so the gateway never tokenizes for this policy: encoding the first
1,024 tokens of a new document costs ~1.6 ms of CPU, hashing its text ~30 us. A piece
stands for ``PIECE_TOKENS`` (16) tokens: K, the learned prefix's block and its depth
bound are given in tokens and divided by 16 (a 64-character piece is ~16 tokens of
English at ~4 characters a token; 16 ids exactly). The same document sent once as text
and once as ids gets two keys. With ``chunk_chars: 0`` the key hashes token ids.

Choice (Mirrokni et al., "Consistent hashing with bounded loads"): walk the ring from the
key and take the first healthy replica ``i`` with

    queued_i + p <= overload * (sum_j queued_j + p) * weight_i / sum_j weight_j

where ``p`` is this request's prompt tokens, or whose queue holds at most
``min_queue_tokens`` (a floor: at light load the fleet's mean queue is below one long
prompt, and the bound alone would move requests off their home replica for no latency
gain). If none fits: the least loaded, reason ``spill``.

What it learns (the key depth's counts, the common prefix) counts each request once: at its
first ``Routed``. A retry on another replica, after a refusal (``Unrouted``) or after a try
that may have reached its replica (timed out), is the same prompt again
(``CountedRequests``); counted twice, a document's rungs read as a prefix whose extensions
come back, and its next question was keyed as a new branch. Another copy's or worker's
retry, told as a new object, comes marked (``Routed.again``) and counts nothing either.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from hashlib import blake2b
from typing import NamedTuple

from policies.base import (
    Decision,
    Finished,
    Policy,
    ReplicaScore,
    ReplicaView,
    Routed,
    RouteEvent,
    RouteRequest,
    healthy,
)
from policies.common_prefix import check_settings, learner_for
from policies.counted_requests import CountedRequests
from policies.key_depth import KeyDepth, Window
from policies.least_load import least_loaded
from policies.prompt_chunks import IDS_PER_CHUNK, id_chunks
from policies.request_memo import RequestMemo
from policies.ring import Ring, RingCache, token_bytes, walk
from policies.size_bounds import check_sizes

PIECE_TOKENS = IDS_PER_CHUNK  # tokens a piece stands for, in the settings' units


@dataclass(frozen=True, slots=True)
class PrefixAffinityConfig:
    """See ``presets/prefix_affinity.yaml`` for what each key means."""

    prefix_tokens: int = 1024
    key_rungs: int = 4
    overload: float = 1.25
    vnodes: int = 1024
    fallbacks: int = 2
    min_queue_tokens: int = 16384
    learn_common_prefix: bool = True
    common_share: float = 0.5
    common_window: int = 1024
    common_block: int = 256
    common_min_samples: int = 64
    max_common_prefix: int = 8192
    chunk_chars: int = 64
    seed: int = 0

    def validate(self) -> None:
        check_settings(self)
        check_sizes(self)
        if self.min_queue_tokens < 0:
            raise ValueError(f"min_queue_tokens must be >= 0, got {self.min_queue_tokens!r}")
        positive = ("prefix_tokens", "key_rungs", "vnodes")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)!r}")
        if self.key_rungs > 64:  # K, K/2, ... : past 64 halvings every rung is 1 token
            raise ValueError(f"key_rungs must be at most 64, got {self.key_rungs!r}")
        if self.chunk_chars < 0:
            raise ValueError(f"chunk_chars must be >= 0, got {self.chunk_chars!r}")
        if self.chunk_chars > 0 and self.learn_common_prefix \
                and self.common_block < PIECE_TOKENS:
            raise ValueError(f"common_block must be >= {PIECE_TOKENS} tokens (one piece) "
                             f"with chunk_chars > 0, got {self.common_block!r}")
        if self.overload < 1.0:
            raise ValueError(f"overload must be >= 1.0, got {self.overload!r}")
        if self.fallbacks < 0:
            raise ValueError(f"fallbacks must be >= 0, got {self.fallbacks!r}")

    def in_pieces(self) -> PrefixAffinityConfig:
        """These settings with K, the learned prefix's block and its depth bound in
        pieces of ``PIECE_TOKENS`` tokens (for ``chunk_chars`` > 0)."""
        return replace(self, prefix_tokens=-(-self.prefix_tokens // PIECE_TOKENS),
                       common_block=self.common_block // PIECE_TOKENS,
                       max_common_prefix=self.max_common_prefix // PIECE_TOKENS)


class _Keyed(NamedTuple):
    """A request's key units (``_key_units``), the window read from them, and its key."""

    units: tuple[memoryview, int, int | None]
    window: Window
    key: int


def request_namespace(request: RouteRequest) -> bytes:
    """What separates keys that must never meet: the model and the cache salt."""
    model, salt = request.model or "", request.cache_salt or ""
    return f"{len(model)}:{model}{len(salt)}:{salt}".encode()


class PrefixAffinity(Policy):
    """Bounded-load consistent hashing of a prefix key; see the module docstring."""

    name = "prefix_affinity"
    reasons = ("affinity", "spill")
    _SCORED = 8  # replicas walked that get a score in the decision

    def __init__(self, config: PrefixAffinityConfig | None = None) -> None:
        self.config = cfg = config or PrefixAffinityConfig()
        self.chunk_chars = cfg.chunk_chars
        self.wants_anchor = cfg.chunk_chars > 0  # a conversation's key ends at its head
        self._rng = random.Random(cfg.seed)
        self._rings = RingCache(cfg.vnodes)
        # K and the learner in the key's units: tokens, or pieces
        self._units = cfg.in_pieces() if cfg.chunk_chars > 0 else cfg
        self._learner = learner_for(self._units)
        self.wants_fingerprint = self._learner is not None  # it tells repeats apart
        self._depth = KeyDepth(self._units.prefix_tokens, cfg.key_rungs)
        # the last request keyed: its key units, window and key
        self._keyed: RequestMemo[_Keyed] = RequestMemo()
        # the requests counted whose end is not told yet: their next tries are retries
        self._counted: CountedRequests[bool] = CountedRequests()

    @property
    def tokens_needed(self) -> int:  # type: ignore[override]
        """K plus the common prefix learned so far (grows as the learner sees more); 0
        when the key hashes pieces."""
        return 0 if self.chunk_chars > 0 else self._window()

    @property
    def chunks_needed(self) -> int | None:  # type: ignore[override]
        """The pieces the key may read (as ``tokens_needed``, in pieces)."""
        return self._window() if self.chunk_chars > 0 else None

    def _window(self) -> int:
        """Units (tokens, or pieces) of the prompt the key may read: K past the common
        prefix learned so far."""
        depth = self._learner.depth if self._learner else 0
        return self._units.prefix_tokens + depth

    @property
    def common_prefix_tokens(self) -> int:
        """Deepest shared prefix learned from traffic, in tokens (pieces count
        ``PIECE_TOKENS`` each)."""
        depth = self._learner.depth if self._learner else 0
        return depth * PIECE_TOKENS if self.chunk_chars > 0 else depth

    def _key_units(self, request: RouteRequest) -> tuple[memoryview, int, int | None]:
        """The prompt's first units as u32 bytes, how many, and its anchor in them."""
        window = self._window()
        if self.chunk_chars <= 0:
            tokens = request.tokens[:window]
            return token_bytes(tokens), len(tokens), request.anchor_tokens
        if request.chunks:
            pieces = request.chunks[:window]
            return token_bytes(pieces), len(pieces), request.anchor_chunks
        # a request made of token ids alone (a caller that skipped the gateway's builder)
        pieces = id_chunks(request.tokens[: window * IDS_PER_CHUNK])
        anchor = request.anchor_tokens
        return token_bytes(pieces), len(pieces), \
            None if anchor is None else anchor // IDS_PER_CHUNK

    def ring(self, replicas: Sequence[ReplicaView]) -> Ring:
        """The ring over these replicas (cached; rebuilt only for a new membership)."""
        return self._rings.layout([r.id for r in replicas], [r.weight for r in replicas])[0]

    def key(self, request: RouteRequest) -> int:
        """The request's 64-bit ring key (the same in every process that has seen its
        prefix: ``key_depth``)."""
        if request.affinity_key is not None:
            h = blake2b(request_namespace(request), digest_size=8)
            h.update(b"\x01")
            h.update(request.affinity_key.encode())
            return int.from_bytes(h.digest(), "little")
        return self._keyed_window(request).key

    def _keyed_window(self, request: RouteRequest) -> _Keyed:
        """``request``'s key units, window and key, derived once for its ``choose`` and
        the ``observe(Routed)`` that follows, which counts the window the request was
        routed by (another request keyed in between: derived again)."""
        keyed = self._keyed.get(request)
        if keyed is None:
            units = self._key_units(request)
            window = self._window_of(request, *units)
            keyed = self._keyed.put(request, _Keyed(units, window, self._depth.pick(window)))
        return keyed

    def _window_of(self, request: RouteRequest, data: memoryview, n: int,
                   anchor: int | None) -> Window:
        """What the key is picked from (``data``, ``n``, ``anchor``: ``_key_units``): at
        most K units after the common prefix, ending at the anchor when the prompt has one
        inside them."""
        skip = self._learner.skip(data, n) if self._learner else 0
        end = min(n, skip + self._units.prefix_tokens)
        if anchor is not None and skip < anchor < end:
            end = anchor  # a conversation keeps its key as its history grows
        h = blake2b(request_namespace(request), digest_size=8)
        h.update(b"\x00")
        return self._depth.window(h, data, skip, end)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        ok = healthy(replicas)
        # The ring covers every replica, healthy or not, and the walk passes over the
        # unhealthy ones: a health flip moves only that replica's keys and never rebuilds.
        ids = [r.id for r in replicas]
        weights = [r.weight for r in replicas]
        queued = [r.queued_tokens for r in replicas]
        up = [r.healthy for r in replicas]
        ring, owners = self._rings.layout(ids, weights)
        p = request.prompt_tokens
        total_w = sum(r.weight for r in ok)
        total_q = sum(r.queued_tokens for r in ok)
        # the bound of replica i is unit * weights[i]; a replica with at most `slack` queued
        # tokens always fits (an idle fleet's mean is below one request)
        slack = self.config.min_queue_tokens
        unit = self.config.overload * (total_q + p) / total_w if total_w > 0 else 0.0
        want = 1 + self.config.fallbacks
        fallbacks = self.config.fallbacks
        ranked: list[int] = []  # replicas after the chosen one (or passed over), ring order
        walked: list[int] = []
        chosen = -1
        for i in walk(ring.points, owners, len(ring), self.key(request)):
            if not up[i]:
                continue
            walked.append(i)
            if chosen < 0 and (queued[i] <= slack or queued[i] + p <= unit * weights[i]):
                chosen = i
            elif chosen >= 0 or len(ranked) < fallbacks:
                ranked.append(i)
            if chosen >= 0 and len(ranked) >= fallbacks:
                break
        # scores, for the first replicas walked: queue with this request / bound
        scores = tuple(
            ReplicaScore(ids[i], (queued[i] + p) / (unit * weights[i]) if unit else 0.0)
            for i in walked[: max(want, self._SCORED)]
        )
        if chosen >= 0:
            ranked_ids = (ids[chosen], *(ids[i] for i in ranked[:fallbacks]))
            return Decision(ranked_ids, "affinity", 0, scores)
        spill = least_loaded(ok, self._rng).id
        rest = [ids[i] for i in ranked if ids[i] != spill][:fallbacks]
        return Decision((spill, *rest), "spill", 0, scores)

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Finished):
            self._counted.ended(event.request)
            return
        if not isinstance(event, Routed) or event.request.affinity_key is not None:
            return
        request = event.request
        if event.again:
            return  # a told retry: counted at its first told try (another copy's, worker's)
        if event.revocable:  # (else no retry nor end of it is told)
            if self._counted.retried(request) is not None:
                return  # counted at its first try (the same prompt, on another replica)
            self._counted.counted(request, True)
        (data, n, _), window, key = self._keyed_window(request)
        self._keyed.clear()  # counted: a later choose of this request keys it afresh
        self._depth.observe(window, key)  # before the learner moves on
        if self._learner:
            length = request.prompt_tokens  # the prompt's length in units
            if self.chunk_chars > 0:  # only the pieces read are there: estimated
                per_piece = request.chunk_tokens if request.chunks else IDS_PER_CHUNK
                length = max(len(request.chunks), round(length / max(per_piece, 1e-9)))
            self._learner.observe(data, n, length, request.fingerprint)
