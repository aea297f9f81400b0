"""The token calibration (replica tokens per gateway token, from the replicas' usage):
one odd answer does not move it far, and it follows a real change."""

from __future__ import annotations

import pytest

from gateway.calibration import TokenCalibration


def test_one_odd_answer_on_a_huge_prompt_moves_the_ratio_little() -> None:
    # 400 answers of 200-token prompts the replica counts 0.9 of; then one 100,000-token
    # prompt it counted 15x (within the 16x believed: a replica of another tokenizer,
    # a prompt's media the gateway does not count). Weighed by its tokens, that one
    # answer outweighed all the others, and the ratio stood near 11 for hundreds of them
    cal = TokenCalibration()
    for _ in range(400):
        cal.observe("m", 180, 200)
    assert cal.ratio("m") == pytest.approx(0.9)
    cal.observe("m", 1_500_000, 100_000)
    assert 0.9 < cal.ratio("m") < 1.2


def test_the_ratio_follows_a_real_change_in_prompts_and_tokenizer() -> None:
    # the model behind the name changes (another tokenizer), and its prompts grow 50x:
    # the ratio comes to the new one, every answer counted
    cal = TokenCalibration()
    for _ in range(400):
        cal.observe("m", 180, 200)
    for _ in range(2_000):
        cal.observe("m", 5_000, 10_000)
    assert cal.ratio("m") == pytest.approx(0.5, rel=0.01)


def test_mixed_prompt_sizes_weigh_by_their_tokens() -> None:
    # prompts of 100 and 300 tokens (template overhead makes the short ones' ratio
    # higher): the ratio of the sums, as before
    cal = TokenCalibration(decay=1.0)
    for _ in range(50):
        cal.observe("m", 120, 100)
        cal.observe("m", 300, 300)
    assert cal.ratio("m") == pytest.approx(420 / 400)
