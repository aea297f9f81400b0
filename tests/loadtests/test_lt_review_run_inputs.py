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
