"""``simulate --pause N:S``: after the Nth request, S seconds without arrivals, then the
rest; ``after_pause`` tells how the 1,000 requests after it fared. A pause that cannot
run is refused naming the value."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from loadtests.pause import Pause, figures_after, pause, paused
from loadtests.simulate import main


@pytest.mark.parametrize("text", ["4000", "0:10", "5:-1", "5:nan", "5:inf", "a:1", "5:x"])
def test_a_pause_no_run_can_take_is_refused_naming_it(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"got {text!r}"):
        pause(text)


def test_the_requests_after_the_pause_come_that_much_later() -> None:
    arrivals = np.array([0.5, 1.0, 1.5, 2.0])
    assert paused(arrivals, pause("2:100")).tolist() == [0.5, 1.0, 101.5, 102.0]
    assert paused(arrivals, None) is arrivals
    with pytest.raises(ValueError, match="after 4 requests needs more than that, got 4"):
        paused(arrivals, Pause(4, 1.0))


def test_the_figures_after_a_change_cover_the_requests_after_it() -> None:
    figures = figures_after(2, [100, 100, 100, 300], [100, 100, 0, 150],
                          [9.0, 9.0, 0.5, 0.5])
    assert figures == {"requests": 2, "token_hit_rate": 150 / 400, "ttft_p95_s": 0.5}


def test_a_simulated_pause_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert main(["--scenario", "contracts-400", "--eviction", "lru", "--requests", "300",
                 "--pause", "200:600", "--policies", "round_robin", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["pause"] == {"after": 200, "seconds": 600.0}
    after = report["policies"]["round_robin"]["after_pause"]
    assert after["requests"] == 100 and 0.0 <= after["token_hit_rate"] < 1.0
    assert report["policies"]["round_robin"]["virtual_seconds"] > 600.0
