"""The token calibration's first answers: one odd answer among them (a prompt the replica
counted 15x, within the 16x believed) does not set the ratio every conversion uses."""

from __future__ import annotations

import pytest

from gateway.calibration import TokenCalibration


@pytest.mark.parametrize("odd_at", [0, 3, 7])
def test_one_odd_answer_among_the_first_does_not_set_the_ratio(odd_at: int) -> None:
    # eight answers learn the ratio: seven 200-token prompts the replica counts 0.9 of,
    # and one 100,000-token prompt it counted 15x. Taken whole, that one held the ratio
    # near 15 (every scraped queue and capacity divided by it) for hundreds of answers
    cal = TokenCalibration()
    for i in range(8):
        if i == odd_at:
            cal.observe("m", 1_500_000, 100_000)
        else:
            cal.observe("m", 180, 200)
    assert cal.learned("m")
    assert cal.ratio("m") == pytest.approx(0.9)
    assert cal.ratio("another model") == pytest.approx(0.9)  # the fleet's mean too


def test_the_first_answers_of_mixed_prompts_weigh_by_their_tokens() -> None:
    # prompts of 100 and 300 tokens whose ratios differ (template overhead on the short
    # ones): all of them count, by their tokens, as after the first answers
    cal = TokenCalibration(decay=1.0)
    for _ in range(4):
        cal.observe("m", 120, 100)
        cal.observe("m", 300, 300)
    assert cal.ratio("m") == pytest.approx(420 / 400)
