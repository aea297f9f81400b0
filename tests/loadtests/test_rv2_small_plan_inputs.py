"""Inputs of ``kvgate plan`` and the simulator that were taken and not acted on: a hot
share for a contracts scenario, a misspelt policy after good ones, ``--peers`` with one
gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from kvgate.cli import main
from loadtests import simulate as simulate_cli
from loadtests.plan_workload import from_scenario


def test_a_contracts_scenarios_hot_share_is_the_one_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--scenario", "contracts-400", "--hot-share", "0.1",
                 "--sim-requests", "0", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["workload"]["hot_share"] == 0.1 and plan["workload"]["hot_docs"] == 50
    # and the simulator's requests: about a tenth of them to the hot set, not 80%
    work = from_scenario("contracts-400", 0.1, 1000)
    hot = sum(r.label == "hot" for r in work.requests)
    assert 50 <= hot <= 150, hot
    assert work.library.hot_share == 0.1


def test_a_misspelt_policy_is_refused_before_any_is_simulated(
        capsys: pytest.CaptureFixture[str]) -> None:
    simulated: list[str] = []

    def watch(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is simulate_cli.simulate.__code__:
            simulated.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        code = main(["plan", "--scenario", "contracts-400", "--sim-requests", "20",
                     "--policies", "round_robin,prefix_afinity", "--json"])
    finally:
        sys.setprofile(None)
    err = capsys.readouterr().err
    assert code == 2 and simulated == []
    assert "--policies round_robin,prefix_afinity" in err and "'prefix_afinity'" in err


def test_peers_with_one_gateway_are_refused_naming_the_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "sim.json"
    base = ["--scenario", "contracts-400", "--requests", "30", "--policies", "round_robin",
            "--json", str(report)]
    assert simulate_cli.main([*base, "--peers"]) == 2
    err = capsys.readouterr().err
    assert "--peers needs --gateways 2 or more" in err and "got --gateways 1" in err
    assert not report.exists()
    assert simulate_cli.main([*base, "--peers", "--gateways", "2"]) == 0
    ran = json.loads(report.read_text())
    assert ran["peers"] is True and ran["gateways"] == 2


@pytest.mark.parametrize("flags", [["--docs", "10"], ["--hot", "5", "--doc-tokens", "100"]])
@pytest.mark.parametrize("source", [["--scenario", "contracts-400"],
                                    ["--workload", "capture.jsonl"]])
def test_library_sizes_beside_a_scenario_or_capture_are_refused(
        flags: list[str], source: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """They were taken and ignored: the scenario's or the capture's documents were used."""
    assert main(["plan", *source, *flags, "--sim-requests", "0", "--json"]) == 2
    err = capsys.readouterr().err
    assert flags[0] in err and source[0] in err and "Traceback" not in err


def test_library_sizes_alone_are_used(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--docs", "300", "--doc-tokens", "1000", "--hot", "30",
                 "--sim-requests", "0", "--json"]) == 0
    library = json.loads(capsys.readouterr().out)["workload"]
    assert (library["docs"], library["doc_tokens"], library["hot_docs"]) == (300, 1000, 30)
