"""``python -m loadtests.run`` checks the workload's parameters (``--set``) before any fleet
starts: a misspelt or impossible one is refused naming it, exit 2, instead of a fleet
started for the first policy and a traceback from Locust, which failed building the
stream its clients draw from."""

import pytest

from loadtests.run import RunConfig, main, run


@pytest.mark.parametrize(("setting", "said"), [
    ("num_doc=40", "unknown key 'num_doc'"),
    ("num_docs=-3", "num_docs must be a positive number, got -3"),
])
def test_a_workload_parameter_no_run_can_take_is_refused_before_any_fleet_starts(
        setting: str, said: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert main(["--policies", "round_robin", "--duration", "1", "--replicas", "1",
                 "--set", setting, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not out.exists()


def test_a_run_config_whose_workload_no_run_can_take_is_refused() -> None:
    with pytest.raises(ValueError, match="workload chat: unknown key 'num_docs'"):
        run(RunConfig(scenario="chat", policies=("round_robin",), duration_s=1,
                      workload={"num_docs": 40}))
