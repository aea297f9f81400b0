import math
import random
from collections import Counter

import pytest

from policies.frequency import FrequencySketch
from policies.ring import stable_hash


def keys(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [stable_hash(rng.randbytes(8)) for _ in range(n)]


def test_estimates_never_under_and_within_the_error_bound() -> None:
    sketch = FrequencySketch(width=1024, depth=4, window=10**9)  # no decay here
    rng = random.Random(1)
    universe = keys(5000)
    weights = [1.0 / (i + 1) for i in range(len(universe))]  # Zipf: a few heavy keys
    truth: Counter[int] = Counter(rng.choices(universe, weights, k=20_000))
    for key, count in truth.items():
        sketch.add(key, count)
    bound = sketch.error_bound()
    assert bound == pytest.approx(math.e / 1024 * 20_000)
    over = 0
    for key in universe:
        est = sketch.estimate(key)
        assert est >= truth[key]
        over += est - truth[key] > bound
    # P(over-count > bound) <= exp(-depth) per key
    assert over / len(universe) <= math.exp(-4)
    heavy = universe[0]
    assert sketch.estimate(heavy) == truth[heavy]  # the heaviest key is counted exactly


def test_counts_halve_every_window() -> None:
    sketch = FrequencySketch(width=1 << 12, depth=4, window=100)
    hot, *cold = keys(61, seed=2)
    exact: Counter[int] = Counter()
    for i in range(400):
        key = hot if i % 2 == 0 else cold[i % len(cold)]
        sketch.add(key)
        exact[key] += 1
        if (i + 1) % 100 == 0:  # the sketch halved: so does the decayed truth
            for k in exact:
                exact[k] //= 2
        for k in (hot, key):
            assert sketch.estimate(k) >= exact[k]
    # 50 adds per window, halved after each: 25, 37, 43, 46 (towards 50), never near 200
    assert exact[hot] == 46
    assert 46 <= sketch.estimate(hot) <= 50
    assert sketch.total == 93.75  # 100 adds per window: 50, 75, 87.5, 93.75


@pytest.mark.parametrize("width, depth", [(1000, 4), (1, 4), (1024, 0), (1024, 9)])
def test_bad_shapes_are_rejected(width: int, depth: int) -> None:
    with pytest.raises(ValueError, match=r"width|depth"):
        FrequencySketch(width=width, depth=depth)


@pytest.mark.parametrize("depth", [1, 3, 4, 8])
@pytest.mark.parametrize("width", [2, 1024, 1 << 16])
def test_estimate_reads_the_counters_add_raised(depth: int, width: int) -> None:
    # the estimate (unrolled for depth 4) reads each row's counter where add() wrote it
    sketch = FrequencySketch(width=width, depth=depth, window=10**9)
    rng = random.Random(depth * width)
    for key in keys(300, seed=depth):
        new = sketch.add(key, rng.randint(1, 5))
        assert sketch.estimate(key) == new
        assert sketch.estimate(key) == min(sketch._counts[i] for i in sketch._slots(key))
