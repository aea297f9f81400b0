"""``python -m loadtests.run`` refuses a setting no run can take before any fleet starts,
with a message naming it (exit 2), not a traceback after the runs before it."""

import pytest

from loadtests.run import main


@pytest.mark.parametrize(("policies", "said"), [
    ("round_robin,prefix_afinity", "unknown policy 'prefix_afinity'"),
    ("round_robin,round_robin", "policy 'round_robin' is named twice"),
    (",", "--policies names none"),
    ("sglang:no_such", "sglang has no policy 'no_such'"),
])
def test_a_policy_no_run_can_take_is_refused_before_any_fleet_starts(
        policies: str, said: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert main(["--policies", policies, "--duration", "1", "--replicas", "1",
                 "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(("flag", "value"), [
    ("--rate", "-5"), ("--rate", "0"), ("--users", "0"), ("--gateways", "0"),
    ("--replicas", "0"), ("--kv-cache-gib", "0"), ("--max-num-seqs", "0")])
def test_a_count_or_rate_no_run_can_take_is_refused_naming_its_flag(
        flag: str, value: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    argv = ["--policies", "round_robin", "--duration", "1", "--replicas", "1",
            "--json", str(out), flag, value]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be" in err and value in err
    assert not out.exists()


@pytest.mark.parametrize(("field", "value"), [
    ("rate", 0.0), ("rate", float("nan")), ("users", 0), ("gateways", 0),
    ("kv_cache_gib", -1.0), ("max_num_seqs", 0)])
def test_a_run_config_no_run_can_take_is_refused_before_any_fleet_starts(
        field: str, value: float) -> None:
    from loadtests.run import RunConfig, run

    with pytest.raises(ValueError, match=f"{field} must be"):
        run(RunConfig(policies=("round_robin",), duration_s=1, **{field: value}))
