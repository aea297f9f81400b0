"""The ``sim`` executor's embeddings: a deterministic vector of a prompt's token ids.

No model computes it. Each token and each pair of neighbouring tokens adds a sparse random
vector (``FEATURES`` entries of +-weight at positions hashed from the model's seed and the
token ids, a hashed-feature projection); the sum is L2-normalised. So equal inputs give
equal vectors, inputs sharing many tokens give close vectors (cosine grows with the shared
tokens), unrelated inputs give nearly orthogonal ones, and word order moves the vector a
little (through the pairs). Pure Python (a few microseconds a token, each distinct token
or pair hashed once per input): callers run it off the event loop.

``dimensions`` truncates the vector to its first ``dimensions`` entries and normalises
again, as a Matryoshka model's shortened embeddings are defined.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.sim_executor import mix64

FEATURES = 4  # entries each token (and each token pair) adds; even
PAIR_WEIGHT = 0.5  # a pair's entries weigh less than a token's
_PAIR_SALT = 0x5EED_0F_9A125  # keeps a pair's features apart from its tokens'


def seed_of(model_id: str) -> int:
    """A 64-bit seed from the model identity: another model embeds differently."""
    return int.from_bytes(hashlib.blake2b(model_id.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class SimEmbedder:
    """Embeds token ids into ``dim`` floats; the same (seed, ids) give the same vector."""

    dim: int
    seed: int

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int) or isinstance(self.dim, bool) or self.dim < 1:
            raise ValueError(f"embedding dim must be a positive integer, got {self.dim!r}")

    def embed(self, token_ids: Sequence[int], dimensions: int | None = None) -> list[float]:
        """The unit vector of ``token_ids`` (non-empty), of ``dimensions`` entries
        (1..dim; default dim)."""
        if not token_ids:
            raise ValueError("token_ids must not be empty")
        size = self.dim if dimensions is None else dimensions
        if not 1 <= size <= self.dim:
            raise ValueError(f"dimensions must be in [1, {self.dim}], got {dimensions!r}")
        vec = [0.0] * self.dim
        seed, pair_seed = self.seed, self.seed ^ _PAIR_SALT
        memo: dict[int, tuple[tuple[int, float], ...]] = {}  # text repeats its tokens
        pair_memo: dict[int, tuple[tuple[int, float], ...]] = {}
        prev = -1
        for t in token_ids:
            entries = memo.get(t)
            if entries is None:
                entries = memo[t] = self._features(mix64(seed, t), 1.0)
            for i, w in entries:
                vec[i] += w
            if prev >= 0:
                pair = (prev << 32) | t
                entries = pair_memo.get(pair)
                if entries is None:
                    entries = pair_memo[pair] = self._features(mix64(pair_seed, pair),
                                                               PAIR_WEIGHT)
                for i, w in entries:
                    vec[i] += w
            prev = t
        return self._normalised(vec[:size], token_ids)

    def _features(self, h: int, weight: float) -> tuple[tuple[int, float], ...]:
        """The (position, +-weight) entries one token or pair adds: each 32-bit half of
        a mix of its hash gives one (31 bits of position, 1 bit of sign)."""
        dim, out = self.dim, []
        for k in range(FEATURES // 2):
            x = mix64(h, k)
            for half in (x & 0xFFFFFFFF, x >> 32):
                out.append(((half >> 1) % dim, weight if half & 1 else -weight))
        return tuple(out)

    def _normalised(self, vec: list[float], token_ids: Sequence[int]) -> list[float]:
        norm = math.sqrt(math.fsum(v * v for v in vec))
        if norm == 0.0:  # every feature fell outside a short prefix, or cancelled out:
            # one entry picked from the whole input keeps the vector a unit one
            vec[mix64(self.seed, len(token_ids) + sum(token_ids)) % len(vec)] = 1.0
            return vec
        return [v / norm for v in vec]
