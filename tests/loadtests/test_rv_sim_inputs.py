"""Values the simulator and its workloads cannot run are refused, naming the value."""

from __future__ import annotations

import dataclasses
import math

import pytest

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
