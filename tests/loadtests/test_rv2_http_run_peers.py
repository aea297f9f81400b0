"""``python -m loadtests.run --peers`` needs gateway copies to peer: with one copy the fleet
started no peer link, yet the run and its JSON (``config.peers``) said peers were on."""

import pytest

from loadtests.run import RunConfig, main, run


def test_peers_with_one_gateway_copy_is_refused_naming_both_flags(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    assert main(["--policies", "round_robin", "--duration", "1", "--replicas", "1",
                 "--peers", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--peers needs --gateways 2 or more" in err and "got --gateways 1" in err
    assert "Traceback" not in err and not out.exists()


def test_a_run_config_with_peers_and_one_gateway_is_refused() -> None:
    with pytest.raises(ValueError, match="peers needs"):
        run(RunConfig(policies=("round_robin",), duration_s=1, peers=True, gateways=1))
