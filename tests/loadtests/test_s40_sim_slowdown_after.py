"""``simulate --slowdown-after N``: ``--slowdown``'s devices turn slow as the Nth request
arrives (a device that throttles or degrades mid-run); before, every replica runs at the
profile's speed. ``after_slowdown`` tells how the 1,000 requests after it fared."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from loadtests.sim_fleet import FleetSpec, SimFleet
from loadtests.simulate import main


def _step_s(fleet: SimFleet, i: int) -> float:
    return fleet.replicas[i].core.executor.cost_model.step_seconds(  # type: ignore[attr-defined]
        [(0, 2048)])


def test_the_devices_turn_slow_at_the_time_given() -> None:
    spec = dataclasses.replace(FleetSpec(replicas=2), slowdown=(1.0, 3.0), slowdown_at_s=10.0)
    spec.validate()
    fleet = SimFleet(spec)
    before = _step_s(fleet, 1)
    assert before == _step_s(fleet, 0)
    fleet.devices_at(9.5)
    assert _step_s(fleet, 1) == before
    fleet.devices_at(10.0)
    assert _step_s(fleet, 0) == before and _step_s(fleet, 1) == pytest.approx(3 * before)


@pytest.mark.parametrize("slowdown, at", [((), 5.0), ((1.0, 2.0), -1.0), ((2.0,), math.nan),
                                          ((2.0,), math.inf)])
def test_a_time_no_run_can_take_is_refused(slowdown: tuple[float, ...], at: float) -> None:
    with pytest.raises(ValueError, match=f"slowdown_at_s must be a time >= 0 with a slowdown "
                                         f"to take effect, got {at!r}"):
        dataclasses.replace(FleetSpec(), slowdown=slowdown, slowdown_at_s=at).validate()


def test_round_robin_queues_on_the_replica_once_it_turns_slow(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    main(["--scenario", "contracts-400", "--eviction", "lru", "--requests", "600",
          "--policies", "round_robin", "--slowdown", "1,1,1,4", "--slowdown-after", "300",
          "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["fleet"]["slowdown_at_s"] > 0
    after = report["policies"]["round_robin"]["after_slowdown"]
    assert after["requests"] == 300
    # round robin gives r3 its eighth of the prompts: it falls behind once slow
    assert after["ttft_p95_s"] > report["policies"]["round_robin"]["ttft_p50_s"] * 2


def test_the_flag_needs_a_slowdown_and_requests_past_it(capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    for extra in ([], ["--slowdown", "1,2"]):
        assert main(["--scenario", "contracts-400", "--requests", "10", "--policies",
                     "round_robin", "--slowdown-after", "20", *extra]) == 2
        assert "--slowdown-after 20 needs --slowdown and more requests than that, got 10" \
            in capsys.readouterr().err
