"""``SamplingParams`` is the engine's own API (the native ``/generate`` and Python callers
build it): a float field that is NaN or infinite is refused there, naming the field and
the value, as the HTTP layer refuses it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from engine.request import SamplingParams

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", NAN), ("temperature", INF),
    ("top_p", NAN), ("min_p", NAN),
    ("presence_penalty", NAN), ("frequency_penalty", NAN),
    ("repetition_penalty", NAN), ("repetition_penalty", INF),
])
def test_a_float_field_that_is_not_finite_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"^{field} .*\b{value}\b"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("bias", [NAN, INF, -INF])
def test_a_logit_bias_that_is_not_finite_is_refused(bias: float) -> None:
    with pytest.raises(ValueError, match=rf"^logit_bias .*got {bias} for token 7$"):
        SamplingParams(logit_bias=((5, 1.0), (7, bias)))


def test_finite_values_at_the_bounds_are_taken() -> None:
    kw: dict[str, Any] = {"temperature": 1e6, "top_p": 1.0, "min_p": 1.0,
                          "presence_penalty": -2.0, "frequency_penalty": 2.0,
                          "repetition_penalty": 1e6, "logit_bias": ((3, -100.0),)}
    taken = SamplingParams(**kw)  # no bound refuses them: each is kept as given
    assert {k: getattr(taken, k) for k in kw} == kw
