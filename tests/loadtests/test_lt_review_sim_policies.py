"""``python -m loadtests.simulate`` checks --policies and --policy-set before any run: a
parameter for a policy it does not run (a misspelt name) is refused, not dropped."""

import pytest

from loadtests.simulate import main


@pytest.mark.parametrize(("argv", "said"), [
    (["--policies", "prefix_affinity", "--policy-set", "prefix_afinity.overload=2"],
     "--policy-set prefix_afinity.overload=2: expects POLICY.KEY=VALUE for a policy of "
     "--policies (prefix_affinity)"),
    (["--policies", "round_robin", "--policy-set", "overload=2"],
     "--policy-set overload=2"),
    (["--policies", ","], "--policies names none"),
    (["--policies", "round_robin,nope"], "unknown preset 'nope'"),
])
def test_a_policy_or_parameter_no_run_takes_is_refused_before_any_run(
        argv: list[str], said: str, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert main(["--requests", "5", "--json", str(out), *argv]) == 2
    captured = capsys.readouterr()
    assert said in captured.err
    assert "token hit" not in captured.err  # no policy ran
    assert not out.exists()
