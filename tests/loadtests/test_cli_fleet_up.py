"""``kvgate fleet up`` as an operator runs it: values no fleet can use are refused before
anything starts, and a signal while it starts (Ctrl-C, the terminal closing) stops what it
began rather than waiting for the fleet or leaving its processes behind."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import cli_fleet, local_fleet
from tests.support.marked_processes import engines_serving_as
from tests.support.processes import REPO
from tests.support.waiting import wait_until


@pytest.mark.parametrize("flag, value, said", [
    ("--port", "70000", "must be a port in 1-65535 (or 0: any free one), got 70000"),
    ("--kv-cache-gib", "-1", "must be a positive number, got -1"),
    ("--max-num-seqs", "0", "must be >= 1, got 0"),
])
def test_fleet_up_refuses_what_no_fleet_can_use_before_starting_anything(
        flag: str, value: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvgate fleet")
    cli_fleet.add_arguments(parser)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["up", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: {said}" in capsys.readouterr().err
    assert parser.parse_args(["up", "--port", "0"]).port == 0  # any free port


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_while_the_fleet_starts_stops_its_processes(
        tmp_path: Path, sig: signal.Signals) -> None:
    mark = f"kvgate-test-{secrets.token_hex(6)}"
    state = tmp_path / "fleet"
    # the engine listens where the fleet does not look for it: never ready
    up = subprocess.Popen(
        [sys.executable, "-m", "kvgate", "fleet", "up", "--replicas", "1", "--port", "0",
         "--state-dir", str(state), "--engine-arg=--host", "--engine-arg=127.0.0.2",
         f"--engine-arg=--served-by={mark}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: engines_serving_as(mark), 30, "the engine to start")
        up.send_signal(sig)
        _, err = up.communicate(timeout=30)
        assert up.returncode == 130, err
        assert "stopped before the fleet was ready" in err and "Traceback" not in err
        assert not engines_serving_as(mark)
        assert not (state / "fleet.json").exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        for pid in engines_serving_as(mark):
            os.kill(pid, signal.SIGKILL)


def test_a_cancel_that_comes_while_a_process_is_spawned_stops_that_process_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = f"kvgate-test-{secrets.token_hex(6)}"
    fleet = local_fleet.LocalFleet(local_fleet.LocalFleetSpec(
        replicas=2, engine_args=("--host", "127.0.0.2", f"--served-by={mark}")),
        tmp_path / "fleet")
    real_popen = subprocess.Popen

    def popen_then_signal(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        fleet.cancel()  # the signal handler runs before Popen has returned
        return started  # type: ignore[no-any-return]

    monkeypatch.setattr(local_fleet.subprocess, "Popen", popen_then_signal)
    try:
        with pytest.raises(local_fleet.FleetCancelled, match="before engine-r1 started"):
            fleet.start()
        assert not engines_serving_as(mark)  # the first engine, spawned, was stopped
        assert not (tmp_path / "fleet" / "fleet.json").exists()
    finally:
        for pid in engines_serving_as(mark):
            os.kill(pid, signal.SIGKILL)
