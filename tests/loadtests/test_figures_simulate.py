"""The simulator's figures on small streams that can be checked by hand."""

from __future__ import annotations

import math

import pytest

from loadtests.simulate import build_policy, simulate
from tests.support.small_library import SMALL_FLEET, small_library


@pytest.mark.parametrize("bad, message", [(0.0, "must not decrease: request 11 at 0.0 s"),
                                          (math.nan, "finite, got nan")])
def test_arrivals_out_of_order_are_refused_not_run_back_in_time(bad: float,
                                                                 message: str) -> None:
    requests, arrivals = small_library(20)
    arrivals = arrivals.copy()
    arrivals[11] = bad
    with pytest.raises(ValueError, match=message):
        simulate(requests, arrivals, build_policy("round_robin"), SMALL_FLEET)
