"""LogThrottle: one line per interval for a flood, with what it held back since."""

from __future__ import annotations

import pytest

from gateway import log_throttle
from gateway.log_throttle import LogThrottle


def test_a_flood_gives_one_line_an_interval_with_the_count_held_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(log_throttle.time, "monotonic", lambda: clock[0])
    throttle = LogThrottle(10.0)
    assert throttle.due(3) == 0  # the first line is due at once, nothing held before it
    assert [throttle.due() for _ in range(5)] == [None] * 5
    clock[0] += 9.9
    assert throttle.due(2) is None
    clock[0] += 0.1
    assert throttle.due() == 7  # 5 + 2 held back; this one is in the line itself
    assert throttle.due() is None
    clock[0] += 60
    assert throttle.due() == 1


@pytest.mark.parametrize("every", [0.0, -1.0, float("nan")])
def test_an_interval_of_no_length_is_refused_by_value(every: float) -> None:
    with pytest.raises(ValueError, match=repr(every)):
        LogThrottle(every)
