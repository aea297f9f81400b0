"""``simulate --slowdown``: a fleet whose replicas' devices are not all as fast as the
profile's (mixed device generations, a throttled one); factors that cannot run are
refused naming the value."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import pytest

from engine import cli as engine_cli
from engine.cost_model import CostModel, load_profile
from engine.sim_executor import SimExecutor
from kvwire.tokenizer import load_tokenizer
from loadtests import run
from loadtests.local_fleet import LocalFleetSpec
from loadtests.run import RunConfig
from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import main, simulate
from loadtests.workloads import build_spec, generate
from policies.base import Finished, RouteEvent
from policies.cost import Cost


def test_a_slower_device_takes_that_much_longer_a_step() -> None:
    profile = load_profile(FleetSpec().profile)
    steps = [(0, 2048)], [(4096, 1)] * 16  # a prefill chunk, a decode batch
    for step in steps:
        base = CostModel.from_profile(profile).step_seconds(step)
        assert CostModel.from_profile(profile, 3.0).step_seconds(step) \
            == pytest.approx(3 * base)


def test_a_slowdown_past_the_step_overhead_a_profile_may_have_is_refused() -> None:
    profile = load_profile(FleetSpec().profile)
    heavy = dataclasses.replace(profile, gpu=dataclasses.replace(profile.gpu,
                                                                step_overhead_ms=20.0))
    with pytest.raises(ValueError, match=r"slowdown 100 makes profile .* step overhead 2000 ms"):
        CostModel.from_profile(heavy, 100.0)


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


def test_an_engine_started_with_a_slowdown_models_a_slower_device() -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    step = [(0, 2048)]
    base, _ = engine_cli.make_executor(parser.parse_args([]), load_tokenizer(None))
    slow, _ = engine_cli.make_executor(parser.parse_args(["--slowdown", "2.5"]),
                                       load_tokenizer(None))
    assert isinstance(base, SimExecutor) and isinstance(slow, SimExecutor)
    assert slow.cost_model.step_seconds(step) == pytest.approx(
        2.5 * base.cost_model.step_seconds(step))
    with pytest.raises(ValueError, match="the torch executor runs on the device it is given"):
        engine_cli.make_executor(parser.parse_args(["--executor", "torch", "--slowdown", "2"]),
                                 load_tokenizer(None))


@pytest.mark.parametrize("value", ["0", "nan", "101"])
def test_the_engine_refuses_a_slowdown_out_of_range(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--slowdown", value])
    assert f"must be > 0 and <= 100, got {value}" in capsys.readouterr().err


def _run_config(argv: list[str]) -> RunConfig:
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    return run.config_from_args(parser.parse_args(argv))


def test_the_load_run_takes_a_slowdown_per_engine() -> None:
    cfg = _run_config(["--slowdown", "1,3", "--replicas", "2"])
    assert cfg.slowdown == (1.0, 3.0)
    run.check_config(cfg)
    with pytest.raises(ValueError, match="slowdown names 3 replicas, the fleet has 2"):
        run.check_config(_run_config(["--slowdown", "1,1,2", "--replicas", "2"]))
    with pytest.raises(ValueError, match="slowdown names 3 replicas, the fleet has 2"):
        LocalFleetSpec(replicas=2, slowdown=(1.0, 1.0, 2.0)).validate()
    with pytest.raises(SystemExit):
        _run_config(["--slowdown", "1,0"])


def test_the_load_run_takes_a_kvgate_policy_with_settings() -> None:
    run.check_policies(("cost", "cost:slow_replica_ratio=null", "sglang:cache_aware"))
    with pytest.raises(ValueError, match=r"slow_replica_ratio must be >= 1 or null, got 0\.5"):
        run.check_policies(("cost:slow_replica_ratio=0.5",))
    with pytest.raises(ValueError, match="unknown policy 'costly:x=1'"):
        run.check_policies(("costly:x=1",))
    with pytest.raises(ValueError, match="expected key=value"):
        run.check_policies(("cost:slow_replica_ratio",))


class _Told(Cost):
    """``cost``, keeping whether each finished answer told its cached tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[bool] = []

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Finished):
            self.told.append(event.cached_told)
        super().observe(event)


@pytest.mark.parametrize("report", [True, False])
def test_simulated_replicas_tell_their_cached_tokens_or_not(report: bool) -> None:
    spec = build_spec("contracts", seed=0, num_docs=20, hot_docs=5, doc_tokens=500)
    requests = generate(spec, 60)
    policy = _Told()
    simulate(requests, [i * 0.05 for i in range(60)], policy,
             FleetSpec(replicas=2, kv_pool_gib=2.0, idle_kv_gib=1.5, eviction="lru",
                       cached_report=report))
    assert len(policy.told) == 60 and set(policy.told) == {report}
