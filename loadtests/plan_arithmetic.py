"""The capacity arithmetic of a document library on a fleet (``kvgate plan``).

A workload is seen as a library: ``docs`` shared prefixes (documents, system prompts,
conversation histories) of ``doc_tokens`` tokens each; the ``hot_docs`` most used of them
receive ``hot_share`` of the requests; every request adds ``tail_tokens`` of its own (the
question) after its document. A replica has ``idle_kv_gib`` of KV not pinned by running
requests: that is what keeps prefixes between requests.

The numbers, for the contract library on 8 H100 replicas (REFERENCE.md)::

    KV per token    = 2 (K, V) x layers x kv_heads x head_dim x dtype_bytes
                    = 2 x 32 x 8 x 128 x 2 B = 128 KiB
    KV per document = 6,000 x 128 KiB = 750 MiB
    per replica     = idle KV // KV of one request's prompt, whole blocks
                    = 25 GiB // (380 blocks x 16 x 128 KiB) = 33 documents
                      (a document stays cached with the last question asked of it: the
                      engine keeps every full block of a prompt)
    affinity        : each replica owns 250 / 8 = ~31 hot documents; the fleet holds
                      8 x 33 = 264 distinct documents
    round robin     : every replica sees all 250 hot documents and keeps the same 33

Hot prefill per hot request, when the cache holds only hot documents (no cold churn: the
simulator adds that)::

    round robin : (1 - 33 / 250) x 6,000 + 80 = ~5,290 tokens  (a hot question hits 13%)
    affinity    : 80 tokens                                    (its ~31 documents fit)
    reduction   = ~66x: close to two orders of magnitude

A model whose layers attend within a sliding window (Gemma 2 and 3's local layers,
Mistral-7B-v0.1's) keeps only the window's blocks of those layers cached, as vLLM's
hybrid KV cache manager does (``FleetSize.kv_bytes_cached``): a document and a request
take less than their tokens x KV per token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from engine.kv_sizing import GIB

MIB = 1 << 20

ROUTING_WINS = ("routing is worth more than engine tuning: the hot set is larger than one "
                "replica's cache and smaller than the fleet's")
ONE_REPLICA = ("the hot set fits in one replica's cache: every policy keeps it; engine "
               "tuning is worth more than routing")
TOO_BIG = ("the hot set is larger than the fleet's cache: no routing keeps it; add "
           "replicas or KV")


def _require(ok: bool, key: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{key} {rule}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Library:
    """A workload as a document library (see the module docstring)."""

    docs: int
    doc_tokens: float
    hot_docs: int
    hot_share: float
    tail_tokens: float = 80.0

    def __post_init__(self) -> None:
        _require(self.docs > 0, "docs", self.docs, "must be positive")
        _require(self.doc_tokens > 0, "doc_tokens", self.doc_tokens, "must be positive")
        _require(0 < self.hot_docs <= self.docs, "hot_docs", self.hot_docs,
                 f"must be in [1, docs={self.docs}]")
        _require(0 <= self.hot_share <= 1, "hot_share", self.hot_share, "must be in [0, 1]")
        _require(self.tail_tokens >= 0, "tail_tokens", self.tail_tokens, "must be >= 0")


@dataclass(frozen=True, slots=True)
class FleetSize:
    kv_bytes_per_token: int
    idle_kv_gib: float
    replicas: int
    block_size: int = 16
    # the KV a cached prefix of so many tokens keeps in blocks of so many tokens, where
    # some layers keep fewer than all of them (sliding windows: ModelShape.kv_bytes_cached);
    # None: every token of every layer, kv_bytes_per_token each
    kv_bytes_cached: Callable[[int, int], int] | None = None

    def __post_init__(self) -> None:
        for key in ("kv_bytes_per_token", "idle_kv_gib", "replicas", "block_size"):
            value = getattr(self, key)
            _require(value > 0, key, value, "must be positive")


@dataclass(frozen=True, slots=True)
class Arithmetic:
    kv_bytes_per_token: int
    bytes_per_doc: int
    bytes_per_request: int  # a document and its question, in whole blocks
    docs_per_replica: int
    hot_docs_per_replica_affinity: float
    distinct_docs_fleet_affinity: int
    distinct_docs_fleet_round_robin: int
    verdict: str
    # fewest replicas whose idle KV holds the hot set (affinity); None: no replica holds
    # even one document
    replicas_for_hot_set: int | None
    hot_hit_round_robin: float  # share of hot questions whose document is cached
    hot_hit_affinity: float
    hot_prefill_tokens_round_robin: float  # per hot request
    hot_prefill_tokens_affinity: float
    hot_prefill_reduction: float | None  # None: nothing left to prefill under affinity


def request_blocks(library: Library, block_size: int) -> int:
    """A document and its question in whole blocks ([0, doc) document, [doc, doc + tail)
    question), as a request of ``library`` is cached."""
    return math.ceil((library.doc_tokens + library.tail_tokens) / block_size)


def arithmetic(library: Library, fleet: FleetSize) -> Arithmetic:
    """The seed's arithmetic for ``library`` on ``fleet``."""
    per_token, cached = fleet.kv_bytes_per_token, fleet.kv_bytes_cached
    bytes_per_doc = round(library.doc_tokens * per_token) if cached is None else \
        cached(math.ceil(library.doc_tokens), 1)
    blocks = request_blocks(library, fleet.block_size)
    bytes_per_request = blocks * fleet.block_size * per_token if cached is None else \
        cached(blocks * fleet.block_size, fleet.block_size)
    per_replica = int(fleet.idle_kv_gib * GIB) // bytes_per_request
    fleet_docs = per_replica * fleet.replicas
    hot = library.hot_docs
    hot_per_replica = hot / fleet.replicas
    if hot <= per_replica:
        verdict = ONE_REPLICA
    elif hot <= fleet_docs:
        verdict = ROUTING_WINS
    else:
        verdict = TOO_BIG
    hit_rr = min(1.0, per_replica / hot)
    hit_affinity = min(1.0, per_replica / hot_per_replica)
    prefill_rr = (1 - hit_rr) * library.doc_tokens + library.tail_tokens
    prefill_affinity = (1 - hit_affinity) * library.doc_tokens + library.tail_tokens
    return Arithmetic(
        kv_bytes_per_token=per_token,
        bytes_per_doc=bytes_per_doc,
        bytes_per_request=bytes_per_request,
        docs_per_replica=per_replica,
        hot_docs_per_replica_affinity=hot_per_replica,
        distinct_docs_fleet_affinity=min(library.docs, fleet_docs),
        distinct_docs_fleet_round_robin=min(library.docs, per_replica),
        verdict=verdict,
        replicas_for_hot_set=math.ceil(hot / per_replica) if per_replica else None,
        hot_hit_round_robin=hit_rr,
        hot_hit_affinity=hit_affinity,
        hot_prefill_tokens_round_robin=prefill_rr,
        hot_prefill_tokens_affinity=prefill_affinity,
        hot_prefill_reduction=prefill_rr / prefill_affinity if prefill_affinity else None,
    )
