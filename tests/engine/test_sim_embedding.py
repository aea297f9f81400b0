"""The sim executor's embeddings: unit vectors, deterministic per (model, tokens), closer
for inputs that share tokens, nearly orthogonal for unrelated ones; Matryoshka prefixes."""

from __future__ import annotations

import math
import random

import pytest

from engine.sim_embedding import SimEmbedder, seed_of

EMBEDDER = SimEmbedder(512, seed_of("tiny"))


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def test_vectors_are_unit_and_deterministic() -> None:
    rng = random.Random(1)
    for n in (1, 2, 7, 300):
        ids = [rng.randrange(50_000) for _ in range(n)]
        v = EMBEDDER.embed(ids)
        assert len(v) == 512
        assert norm(v) == pytest.approx(1.0, abs=1e-9)
        assert v == SimEmbedder(512, seed_of("tiny")).embed(list(ids))


def test_other_model_or_order_gives_another_vector() -> None:
    ids = list(range(100, 140))
    v = EMBEDDER.embed(ids)
    other_model = SimEmbedder(512, seed_of("other")).embed(ids)
    assert cos(v, other_model) < 0.5
    reordered = EMBEDDER.embed(ids[::-1])  # same tokens, other pairs
    assert 0.5 < cos(v, reordered) < 0.999


def test_shared_tokens_bring_vectors_closer() -> None:
    rng = random.Random(2)
    for _ in range(20):
        base = [rng.randrange(4096) for _ in range(60)]
        near = base[:50] + [rng.randrange(4096) for _ in range(10)]
        far = [rng.randrange(4096) for _ in range(60)]
        v = EMBEDDER.embed(base)
        assert cos(v, EMBEDDER.embed(near)) > 0.6
        assert abs(cos(v, EMBEDDER.embed(far))) < 0.25
        assert cos(v, EMBEDDER.embed(near)) > cos(v, EMBEDDER.embed(far)) + 0.4


def test_unrelated_inputs_are_nearly_orthogonal_on_average() -> None:
    rng = random.Random(3)
    sims = [cos(EMBEDDER.embed([rng.randrange(50_000) for _ in range(30)]),
                EMBEDDER.embed([rng.randrange(50_000) for _ in range(30)]))
            for _ in range(200)]
    mean = sum(sims) / len(sims)
    spread = math.sqrt(sum(s * s for s in sims) / len(sims))
    assert abs(mean) < 0.02
    assert spread < 0.1  # ~ 1/sqrt(512) for random directions


def test_dimensions_are_a_renormalised_prefix() -> None:
    ids = list(range(300, 700))
    full = EMBEDDER.embed(ids)
    for d in (1, 3, 64, 511, 512):
        short = EMBEDDER.embed(ids, d)
        assert len(short) == d
        assert norm(short) == pytest.approx(1.0, abs=1e-9)
        scale = norm(full[:d])
        assert scale > 0  # 400 tokens leave no prefix empty (that case: the next test)
        assert short == pytest.approx([x / scale for x in full[:d]], abs=1e-12)


def test_a_prefix_with_no_feature_is_still_a_unit_vector() -> None:
    # one token puts at most 4 entries in 512: most 1-wide prefixes are empty
    for t in range(50):
        v = EMBEDDER.embed([t], 1)
        assert v in ([1.0], [-1.0])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="dim"):
        SimEmbedder(0, 1)
    with pytest.raises(ValueError, match="empty"):
        EMBEDDER.embed([])
    with pytest.raises(ValueError, match="dimensions"):
        EMBEDDER.embed([1], 513)
