"""The token calibration's table of models stays bounded without shutting out the models
that come after its first ``max_models`` names (adapters loaded and unloaded at run time)."""

from __future__ import annotations

import pytest

from gateway.calibration import TokenCalibration


def test_a_model_after_max_models_one_off_names_learns_its_own_ratio() -> None:
    cal = TokenCalibration(max_models=8)
    for _ in range(cal.min_samples):
        cal.observe("base", 100, 100)
    for i in range(3 * cal.max_models):  # adapters, each answered once, long gone
        cal.observe(f"adapter-{i}", 100, 100)
    for _ in range(cal.min_samples):  # a model deployed later, its tokenizer its own
        cal.observe("late", 300, 100)
    assert cal.ratio("late") == pytest.approx(3.0)
    assert cal.ratio("base") == pytest.approx(1.0)  # a learned model is kept meanwhile
    assert len(cal) == cal.max_models


def test_when_every_model_has_learned_the_least_recently_answered_goes() -> None:
    cal = TokenCalibration(max_models=4)
    for name in ("a", "b", "c", "d"):
        for _ in range(cal.min_samples):
            cal.observe(name, 200, 100)
    cal.observe("a", 200, 100)  # "b" is now the one answered longest ago
    for _ in range(cal.min_samples):
        cal.observe("e", 500, 100)
    assert cal.ratio("e") == pytest.approx(5.0)
    assert set(cal.snapshot()) == {"a", "c", "d", "e"}
