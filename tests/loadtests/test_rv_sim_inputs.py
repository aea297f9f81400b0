"""Values the simulator and its workloads cannot run are refused, naming the value."""

from __future__ import annotations

import dataclasses
import math

import pytest

from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import main
from loadtests.workloads import ChatAppsSpec


@pytest.mark.parametrize("rate", [math.nan, math.inf])
def test_chat_apps_refuse_a_rate_that_is_no_positive_number(rate: float) -> None:
    # NaN drew conversations forever (memory growing without end); inf put every
    # conversation at t=0 and wrote Infinity, no JSON number, as the arrival rate
    spec = dataclasses.replace(ChatAppsSpec(), rate=rate)
    with pytest.raises(ValueError, match=f"rate must be a positive number, got {rate!r}"):
        spec.validate()  # generate's first step


def test_the_rate_flag_refuses_infinity_before_any_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "chat-apps", "--requests", "10", "--policies", "round_robin",
              "--rate", "inf"])
    assert exited.value.code == 2
    assert "--rate: must be a positive number, got inf" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["scrape_interval_s", "kv_pool_gib", "idle_kv_gib"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_fleet_size_or_interval_that_is_no_positive_number_is_refused(
        key: str, value: float) -> None:
    # a NaN scrape interval never scraped (every policy decided on empty views), a NaN
    # pool failed converting it to blocks with a message that named nothing
    spec = dataclasses.replace(FleetSpec(), **{key: value})
    with pytest.raises(ValueError, match=f"{key} must be a positive number, got {value!r}"):
        spec.validate()


@pytest.mark.parametrize("flag", ["--scrape-interval", "--kv-pool-gib", "--idle-kv-gib"])
def test_the_fleet_flags_refuse_nan_naming_the_flag(
        flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "contracts-400", "--requests", "10", "--policies",
              "round_robin", flag, "nan"])
    assert exited.value.code == 2
    assert f"{flag}: must be a positive number, got nan" in capsys.readouterr().err


def test_a_rate_set_as_a_workload_parameter_is_refused_naming_the_option() -> None:
    # chat-apps took it and drew its arrivals at --rate (or the scenario's) instead
    with pytest.raises(SystemExit, match=r"--set rate=.*--rate"):
        main(["--scenario", "chat-apps", "--requests", "10", "--policies", "round_robin",
              "--set", "rate=2"])
