"""A config.json's own ``num_parameters`` is checked, and is the count the shape takes:
the estimate only gives its active share, where the estimate can be made."""

from __future__ import annotations

import pytest

from engine.hf_shape import estimate_params, shape_from_config
from tests.support.model_configs import LLAMA3_8B, MIXTRAL_8X7B


@pytest.mark.parametrize("given", ["46.7e9", True, 0, -8e9, float("inf"), float("nan"),
                                   [8e9]])
def test_a_count_no_model_has_is_refused_naming_it(given: object) -> None:
    with pytest.raises(ValueError) as exc:
        shape_from_config({**MIXTRAL_8X7B, "num_parameters": given})
    assert str(exc.value) == ("config.json num_parameters must be a positive number, "
                              f"got {given!r}")


def test_a_given_count_needs_no_vocab_size() -> None:
    no_vocab = {k: v for k, v in LLAMA3_8B.items() if k != "vocab_size"}
    shape = shape_from_config({**no_vocab, "num_parameters": 8_030_261_248})
    assert (shape.params, shape.active_params) == (8_030_261_248.0, None)
    assert shape.active == 8_030_261_248.0
    with pytest.raises(ValueError) as exc:
        shape_from_config(no_vocab)  # nothing to count them from
    assert str(exc.value) == "config.json vocab_size must be a positive integer, got None"


def test_a_given_count_keeps_the_estimates_active_share() -> None:
    count = estimate_params(MIXTRAL_8X7B)
    shape = shape_from_config({**MIXTRAL_8X7B, "num_parameters": 46_702_792_704})
    assert shape.params == 46_702_792_704.0
    assert shape.active == pytest.approx(46_702_792_704 * count.active / count.total)
    assert (shape.num_experts, shape.experts_per_token) == (8, 2)
    dense = shape_from_config({**LLAMA3_8B, "num_parameters": 8e9})
    assert (dense.params, dense.active_params) == (8e9, None)
