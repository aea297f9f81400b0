"""The contract between the gateway (or the offline simulator) and a routing policy.

A policy sees a ``RouteRequest`` and an immutable snapshot of the fleet (``ReplicaView``
per replica) and returns a ``Decision``: replica ids ranked best first, a reason and the
tokens it expects the first choice to have cached.

Rules every policy keeps:

* ``choose`` is synchronous, pure CPU and fast: no awaits, no I/O, and it does not change
  the policy's routing state (``/admin/explain`` calls it without sending anything). A
  policy-owned random generator for tie breaks is the only state it may advance.
* ``observe`` is where state changes: a request is being sent to a replica (``Routed``,
  once per attempt), that replica refused it before taking the prompt (``Unrouted``), a
  request finished (``Finished``), a replica left (``ReplicaRemoved``) or restarted and
  lost its cache (``ReplicaReset``).
* ``tokens_needed`` tells the caller how many leading prompt tokens to tokenize: ``0`` for
  none, ``None`` for the whole prompt. ``chunk_chars`` > 0 asks for the prompt's chunk
  hashes instead (``prompt_chunks``), which cost no tokenization: the first
  ``chunks_needed`` of them (``None``: all); ``wants_anchor`` also asks for a chat's anchor
  in them (``RouteRequest.anchor_chunks``); ``wants_fingerprint`` asks for
  ``RouteRequest.fingerprint`` (left None otherwise: hashing a long prompt costs).
* ``kv_index``, when not None, is an exact index of what each replica caches that the
  policy reads; the gateway feeds it from the replicas' KV events
  (``gateway.kv_event_subscriber``), the simulator from its engines' block pools.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple

if TYPE_CHECKING:
    from policies.kv_index import KVIndex


@dataclass(frozen=True, slots=True, weakref_slot=True)
class RouteRequest:
    """What a policy may know about one request.

    ``tokens`` holds the first ``tokens_needed`` prompt token ids (all of them when the
    policy asked for ``None``); ``prompt_tokens`` is the full prompt length (exact when the
    whole prompt was tokenized, else an estimate from the text length). ``anchor_tokens``,
    when known, is how many leading tokens stay the same over a conversation's turns (a
    chat's messages up to and including its first user message). ``fingerprint``, when
    known, identifies the whole prompt (equal prompts, equal fingerprints), so policies can
    tell a burst of one prompt from many prompts sharing a prefix. ``arrival_s`` is when
    the request arrived, in seconds on a clock of the caller's (monotonic in the gateway,
    virtual in the simulator).
    ``chunks``, for a policy with ``chunk_chars``, identifies the prompt's consecutive
    pieces without tokenizing it (``prompt_chunks``); each is worth about ``chunk_tokens``
    gateway tokens; ``anchor_chunks``, when asked for and known, is the anchor in those
    pieces (the whole pieces a chat's head covers). ``base_model``: when ``model`` is a
    LoRA adapter (a replica lists it with a ``parent``), that parent, the model whose
    replicas serve the adapter; None for a base model, or a model no replica lists.
    """

    tokens: Sequence[int]
    prompt_tokens: int
    request_id: str = ""
    model: str | None = None
    tenant: str | None = None
    cache_salt: str | None = None
    affinity_key: str | None = None
    anchor_tokens: int | None = None
    fingerprint: int | None = None
    arrival_s: float | None = None
    chunks: Sequence[int] = ()
    chunk_tokens: float = 0.0
    anchor_chunks: int | None = None
    base_model: str | None = None

    @property
    def adapter(self) -> bool:
        """Whether ``model`` is a LoRA adapter some replica lists."""
        return self.base_model is not None


class ReplicaView(NamedTuple):
    """An immutable snapshot of one replica, taken for one decision (a named tuple: the
    gateway builds one per replica per request).

    ``queued_tokens`` is the prompt tokens this gateway sent the replica and has not seen a
    first byte for, plus what the replica's scraped queue gauge held beyond those at the
    last scrape (other senders'; see ``gateway.fleet``). ``epoch`` increases each
    time the replica is seen to restart (its counters reset), so policies can drop what
    they believed it cached. ``prefill_tokens_per_s`` is the replica's recent rate of
    prompt tokens computed (not served from cache), when its counters tell it.
    ``pending_age_s`` is how long the oldest request this gateway sent it has waited for a
    first byte (0 when none waits) and ``pending_head_tokens`` what that request has to
    prefill: the replica is likely that far into it. Token counts are in the gateway's
    tokens (converted from the replica's where they differ). ``running`` and ``waiting``
    are the replica's gauges at the last scrape; ``in_flight`` is this gateway's requests
    there now, and ``others_in_flight`` what the gauges held beyond this gateway's in
    flight at that scrape (other senders'): the two add up to the requests there now
    without the scrape's lag on this gateway's own. ``scrape_seq`` tells which scrape the
    gauges came from (views read again between scrapes repeat it), and ``prefilling`` how
    many of this gateway's requests there had no first byte then beyond the ``waiting``
    ones: requests the replica was running but had not finished prefilling.
    ``slot_hold_s`` is the mean seconds the replica's requests that finished between its
    last two scrapes ran, from first scheduled to finished (any sender's: vLLM's
    ``request_inference_time_seconds``), None where none finished or it exports none.
    """

    id: str
    url: str = ""
    healthy: bool = True
    weight: float = 1.0
    queued_tokens: int = 0
    running: int = 0
    waiting: int = 0
    in_flight: int = 0
    kv_usage: float = 0.0
    kv_capacity_tokens: int | None = None
    token_hit_rate: float | None = None
    epoch: int = 0
    prefill_tokens_per_s: float | None = None
    pending_age_s: float = 0.0
    pending_head_tokens: int = 0
    others_in_flight: int = 0
    scrape_seq: int = 0
    prefilling: int = 0
    slot_hold_s: float | None = None


class ReplicaScore(NamedTuple):
    """One replica's standing in a decision (for ``/admin/explain`` and tests);
    ``terms`` names the parts a score was summed from, when the policy has them. (A named
    tuple: a decision builds one per scored candidate.)"""

    replica: str
    score: float
    matched_tokens: int = 0
    terms: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """Replica ids ranked best first; the gateway tries them in order on failure."""

    ranked: tuple[str, ...]
    reason: str
    matched_tokens: int = 0
    scores: tuple[ReplicaScore, ...] = ()

    @property
    def chosen(self) -> str:
        return self.ranked[0]


@dataclass(frozen=True, slots=True)
class Routed:
    """The request is being sent to ``replica``. Observed when it is sent, before any
    answer, so concurrent decisions see it; a retry on another replica observes a second
    ``Routed``. ``Finished`` names the replica that finally answered. ``replicas``, when
    the caller has it, is the fleet snapshot the decision was made on, so a policy can
    learn facts about the replicas (epoch, KV capacity) in ``observe``, never in
    ``choose``. ``revocable``: the caller tells how the try ends (an ``Unrouted`` when
    its replica refuses it, else the next ``Routed`` or the request's ``Finished``); a
    route another gateway copy or worker process made is told once, as it stands
    (False), and a policy keeps nothing to take it back. ``again``: such a told route is
    a later try of a request whose earlier try was told too (the other copy or worker
    tried it again, on another replica). Each told try arrives as a new object, so this
    says what identity says of the caller's own retries: what the request tells of the
    traffic was counted at its first told try; what this try makes the policy believe of
    its replica's cache counts."""

    request: RouteRequest
    replica: str
    replicas: Sequence[ReplicaView] = ()
    revocable: bool = True
    again: bool = False


@dataclass(frozen=True, slots=True)
class Unrouted:
    """The try last sent to ``replica`` with ``Routed`` was refused before the replica took
    the prompt: it shed load (429, 503), could not be reached, did not store what the
    request continues (404), or answered a 5xx status (not a stream that opened with an
    error event: that replica took the prompt). The replica neither holds nor computes
    the prompt, so a policy takes back what that ``Routed`` made it believe of the
    replica's cache. ``request`` is the object ``Routed`` carried. A try that may have
    reached the replica's queue (a timeout, a broken connection, a client that left)
    keeps its ``Routed``."""

    request: RouteRequest
    replica: str


@dataclass(frozen=True, slots=True)
class Finished:
    """The request finished on ``replica``; ``cached_tokens`` (in the gateway's tokens)
    when the replica reported its usage, ``ttft_s`` when its first token's time is known,
    ``duration_s`` from sending it to its last byte. ``cached_told``: whether the usage
    told the cached tokens (vLLM tells them only with ``--enable-prompt-tokens-details``,
    SGLang with ``--enable-cache-report``): where not, ``cached_tokens`` is 0 whatever the
    replica held, and a cache hit reads as a fast prefill."""

    request: RouteRequest
    replica: str
    ok: bool
    cached_tokens: int | None = None
    ttft_s: float | None = None
    duration_s: float | None = None
    cached_told: bool = True


@dataclass(frozen=True, slots=True)
class ReplicaRemoved:
    replica: str


@dataclass(frozen=True, slots=True)
class ReplicaReset:
    """The replica restarted: whatever it had cached is gone. ``cache_only``: only its
    prefix cache was emptied (a flush), the process and its device the same."""

    replica: str
    cache_only: bool = False


RouteEvent = Routed | Unrouted | Finished | ReplicaRemoved | ReplicaReset


class NoReplicaError(RuntimeError):
    """Raised by ``choose`` when no healthy replica exists."""


class Policy(ABC):
    """Base class of every routing policy (see the module docstring for the rules)."""

    name: ClassVar[str]
    reasons: ClassVar[tuple[str, ...]] = ()  # every Decision.reason it gives
    tokens_needed: int | None = 0
    chunk_chars: int = 0
    chunks_needed: int | None = None
    wants_anchor: bool = False
    wants_fingerprint: bool = False
    kv_index: KVIndex | None = None

    @abstractmethod
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        """Rank the healthy replicas for ``request``; raise ``NoReplicaError`` if none."""

    def explain(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        """The decision ``choose`` would take, for ``/admin/explain``: ``choose`` with the
        policy's tie-breaking draws (``_rng``, where it has one) put back as they were, so
        that explaining a request does not change where the next one goes."""
        rng: random.Random | None = getattr(self, "_rng", None)
        drawn = rng.getstate() if rng is not None else None
        try:
            return self.choose(request, replicas)
        finally:
            if rng is not None:
                rng.setstate(drawn)  # type: ignore[arg-type]

    def observe(self, event: RouteEvent) -> None:  # noqa: B027 - optional hook
        """Update routing state after something happened; the default keeps no state."""

    def describe(self) -> dict[str, object]:
        """What the policy has learned, for ``/admin/explain`` (JSON-ready); none here."""
        return {}

    def describe_for(self, request: RouteRequest) -> dict[str, object]:
        """What the state that decides ``request`` has learned (``/admin/explain``): the
        policy's, unless it keeps a state per model (``PerModel``)."""
        return self.describe()

    def share_from(self, first: Policy) -> None:
        """Take from ``first``, another instance of this policy (``PerModel``'s first,
        deciding for another model), the state kept once for every model: the KV event
        index (kept per replica, fed once). A policy whose memory bound is the whole
        gateway's adds what else it shares."""
        if self.kv_index is not None:
            self.kv_index = first.kv_index


def healthy(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """The healthy replicas, or ``NoReplicaError`` naming how many were seen."""
    ok = [r for r in replicas if r.healthy]
    if not ok:
        raise NoReplicaError(f"no healthy replica among {len(replicas)}")
    return ok


def usable_capacity(capacity_tokens: int | None) -> int | None:
    """A view's KV capacity (``ReplicaView.kv_capacity_tokens``), or None (unknown) where it
    tells nothing: 0 or less, NaN or infinite (a foreign server's gauges). Policies take
    such a replica to have their default capacity: a negative one gave it a negative
    budget (it kept nothing and never matched), an infinite one failed every decision."""
    if capacity_tokens is not None and 0 < capacity_tokens < math.inf:
        return capacity_tokens
    return None
