"""``simulate --slowdown``: a fleet whose replicas' devices are not all as fast as the
profile's (mixed device generations, a throttled one); factors that cannot run are
refused naming the value."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from engine.cost_model import CostModel, load_profile
from loadtests.sim_fleet import FleetSpec, slower
from loadtests.simulate import main


def test_a_slower_device_takes_that_much_longer_a_step() -> None:
    profile = load_profile(FleetSpec().profile)
    steps = [(0, 2048)], [(4096, 1)] * 16  # a prefill chunk, a decode batch
    for step in steps:
        base = CostModel.from_profile(profile).step_seconds(step)
        assert slower(profile, 3.0).step_seconds(step) == pytest.approx(3 * base)


def test_round_robin_queues_on_the_one_slow_replica(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    main(["--scenario", "contracts-400", "--eviction", "lru", "--requests", "400",
          "--policies", "round_robin", "--slowdown", "1,1,1,4", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["fleet"]["slowdown"] == [1.0, 1.0, 1.0, 4.0]
    tail = report["policies"]["round_robin"]["ttft_tail"]["by_replica"]
    # round robin gives r3 its eighth of the prompts: only it falls behind
    assert tail[3] == sum(tail) > 0, tail


@pytest.mark.parametrize("factors, says", [
    ((1.0, math.nan), "slowdown of r1 must be in (0, 100], got nan"),
    ((0.0,), "slowdown of r0 must be in (0, 100], got 0.0"),
    ((1.0, 1000.0), "slowdown of r1 must be in (0, 100], got 1000.0"),
    ((1.0,) * 9, "slowdown names 9 replicas, the fleet has 8"),
])
def test_factors_that_cannot_run_are_refused(factors: tuple[float, ...], says: str) -> None:
    with pytest.raises(ValueError, match=f"^{says.replace('(', '[(]').replace(')', '[)]')}$"):
        dataclasses.replace(FleetSpec(), slowdown=factors).validate()


def test_the_flag_refuses_what_is_no_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "contracts-400", "--requests", "10", "--policies", "round_robin",
              "--slowdown", "1,fast"])
    assert exited.value.code == 2
    assert "expected comma-separated numbers (1,1,3), got '1,fast'" in capsys.readouterr().err
