"""``placement_oracle:H``: the simulator's clairvoyant reference placement of the contract
workloads (hot documents fixed on H replicas, cold ones on the others)."""

from __future__ import annotations

import json

import pytest

from loadtests.placement_oracle import oracle_replicas
from loadtests.simulate import main


def _run(tmp_path, *argv: str) -> dict:
    out = tmp_path / "out.json"
    assert main(["--scenario", "contracts-400", "--requests", "600", "--seed", "0",
                 "--json", str(out), *argv]) == 0
    return json.loads(out.read_text())


def test_hot_documents_stay_on_their_replicas_and_cold_ones_on_the_others(tmp_path) -> None:
    report = _run(tmp_path, "--policies", "placement_oracle:5")
    result = report["policies"]["placement_oracle:5"]
    reasons = result["reasons"]
    assert reasons["hot_home"] + reasons["cold_rest"] == 600
    assert 0.7 < reasons["hot_home"] / 600 < 0.9  # the scenario's 80% hot
    # never moved: a hot document misses its first request and what its home's LRU
    # cache evicts, never a move to another replica
    assert result["hot_misses"]["moved"]["requests"] == 0
    assert result["hot_misses"]["first"]["requests"] > 0
    counts = result["replica_requests"]
    # 50 hot documents over 5 replicas, 10 each: about a fifth of the hot requests each
    assert all(0.1 * reasons["hot_home"] < n < 0.35 * reasons["hot_home"]
               for n in counts[:5])
    assert sum(counts[5:]) == reasons["cold_rest"]
    assert all(n > 0 for n in counts[5:])  # the least queued of three: each takes some


def test_the_oracle_runs_beside_the_policies_on_the_same_requests(tmp_path) -> None:
    report = _run(tmp_path, "--policies", "round_robin,placement_oracle:6")
    oracle = report["policies"]["placement_oracle:6"]
    rr = report["policies"]["round_robin"]
    assert oracle["requests"] == rr["requests"] == 600
    assert oracle["prompt_tokens"] == rr["prompt_tokens"]
    assert oracle["token_hit_rate"] > 3 * rr["token_hit_rate"]


@pytest.mark.parametrize(("name", "replicas"), [
    ("placement_oracle:6", 6), ("placement_oracle:12", 12), ("cost", None),
    ("placement_oracle_x", None)])
def test_the_name_gives_the_hot_replicas(name: str, replicas: int | None) -> None:
    assert oracle_replicas(name) == replicas


@pytest.mark.parametrize("name", ["placement_oracle", "placement_oracle:", "placement_oracle:0",
                                  "placement_oracle:-1", "placement_oracle:six"])
def test_a_malformed_name_is_refused_by_value(name: str) -> None:
    with pytest.raises(ValueError, match=repr(name)):
        oracle_replicas(name)


@pytest.mark.parametrize(("argv", "said"), [
    (["--policies", "placement_oracle:8"], "needs more than 8 replicas"),
    (["--policies", "placement_oracle:4", "--gateways", "2"],
     "runs in one gateway copy, got --gateways 2"),
    (["--policies", "placement_oracle:4", "--policy-set", "placement_oracle:4.x=1"],
     "takes no parameters"),
    (["--scenario", "chat-apps", "--policies", "placement_oracle:4"],
     "places the contract workloads' hot and cold documents"),
])
def test_what_the_oracle_cannot_place_is_refused(argv: list[str], said: str, tmp_path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--scenario", "contracts-400", "--requests", "40", "--json",
                 str(tmp_path / "o.json"), *argv]) == 2
    assert said in capsys.readouterr().err
