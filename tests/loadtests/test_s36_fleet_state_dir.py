"""The local fleet's state directory and records: ``kvgate fleet up`` uses a directory that
is this user's alone and writes nothing through a link there; ``kvgate fleet down`` signals
only the processes the fleet started, those of a start that was killed included; a record
whose processes are gone does not block the next ``up``."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import local_fleet
from tests.support.marked_processes import engines_serving_as
from tests.support.processes import REPO
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

NOBODY = 65534


def kvgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvgate", *args], capture_output=True,
                          text=True, timeout=120, check=False, cwd=REPO)


def started_at(pid: int) -> int:
    """Process ``pid``'s start time (/proc/<pid>/stat's 22nd field, clock ticks)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def sleeper() -> subprocess.Popen[bytes]:
    """A process with ``-m kvgate`` in its command line that no fleet started, in a session
    of its own (as a separately started ``kvgate engine`` may run)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "-m", "kvgate", "engine"], start_new_session=True)


def test_fleet_up_and_down_refuse_a_state_directory_that_is_not_this_users_alone(
        tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    theirs = tmp_path / "theirs"  # made by another user, holding a link to our file
    theirs.mkdir()
    (theirs / "engine-r0.log").symlink_to(victim)
    os.chown(theirs / "engine-r0.log", NOBODY, NOBODY, follow_symlinks=False)
    os.chown(theirs, NOBODY, NOBODY)
    shared = tmp_path / "shared"  # ours, but others may write in it
    shared.mkdir()
    shared.chmod(0o777)
    for state, said in [(theirs, f"is owned by uid {NOBODY}, not by uid {os.geteuid()}"),
                        (shared, "is writable by group or others (mode 0777)")]:
        for command in (["up", "--detach", "--replicas", "1", "--port", "0"], ["down"]):
            run = kvgate("fleet", *command, "--state-dir", str(state))
            if run.returncode == 0 and command[0] == "up":  # not refused: stop its fleet
                kvgate("fleet", "down", "--state-dir", str(state))
            assert run.returncode == 1, run.stderr
            assert run.stderr.startswith(
                f"kvgate fleet {command[0]}: state directory {state} {said}")
            assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
        assert sorted(p.name for p in state.iterdir()) == \
            (["engine-r0.log"] if state == theirs else [])
    assert victim.read_text() == "precious"


def test_the_fleet_replaces_links_in_its_directory_rather_than_writing_through_them(
        tmp_path: Path) -> None:
    state = tmp_path / "fleet"
    state.mkdir(mode=0o700)
    targets = {name: tmp_path / f"target-{name}" for name in ("engine-r0.log", "gateway.yaml")}
    for name, target in targets.items():
        target.write_text("precious")
        (state / name).symlink_to(target)
    fleet = local_fleet.LocalFleet(local_fleet.LocalFleetSpec(replicas=1, kv_cache_gib=0.5),
                                   state)
    try:
        fleet.start()
        for name, target in targets.items():
            assert target.read_text() == "precious"
            assert not (state / name).is_symlink()
            assert (state / name).stat().st_mode & 0o077 == 0
        assert "replicas" in (state / "gateway.yaml").read_text()
    finally:
        fleet.stop()


def test_fleet_down_signals_no_process_whose_recorded_pid_another_has_now(
        tmp_path: Path) -> None:
    other = sleeper()
    try:
        wait_until(lambda: b"kvgate" in Path(f"/proc/{other.pid}/cmdline").read_bytes(), 10,
                   "the other process to run")
        # (a record without start times, an older kvgate's, is read as that version read
        # it: test_s36_fleet_older_record)
        for record in ({"name": "gateway", "pid": other.pid, "log": "x",
                        "started": started_at(other.pid) - 1},):  # an earlier process's
            state = tmp_path / f"fleet-{len(record)}"
            state.mkdir(mode=0o700)
            (state / "fleet.json").write_text(json.dumps({"processes": [record]}))
            down = kvgate("fleet", "down", "--state-dir", str(state))
            assert down.returncode == 0, down.stderr
            assert down.stdout == ("the recorded fleet had already stopped (none of pids "
                                   f"{other.pid} runs it); removed its record\n")
            assert other.poll() is None
            assert not (state / "fleet.json").exists()
    finally:
        other.kill()
        other.wait()


def test_a_record_whose_processes_are_gone_gives_way_to_a_new_fleet(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "fleet"
    state.mkdir(mode=0o700)
    recorded = sleeper()  # what a fleet left, running until stopped
    spec = local_fleet.LocalFleetSpec(replicas=1, gateways=0, kv_cache_gib=0.5)
    try:
        (state / "fleet.json").write_text(json.dumps({"processes": [
            {"name": "engine-r0", "pid": recorded.pid, "started": started_at(recorded.pid),
             "log": "x"}]}))
        with pytest.raises(local_fleet.FleetError, match="a fleet is already recorded in"):
            local_fleet.LocalFleet(spec, state).start()
    finally:
        recorded.kill()
        recorded.wait()
    fleet = local_fleet.LocalFleet(spec, state)
    with caplog.at_level(logging.WARNING, logger="loadtests.local_fleet"):
        try:
            fleet.start()
            assert fleet.alive()
            assert [p.name for p in state.glob("fleet*.json")] == ["fleet.json"]
        finally:
            fleet.stop()
    assert f"the fleet recorded in {state / 'fleet.json'} has stopped; starting a new one" \
        in caplog.messages


def test_fleet_down_stops_the_processes_of_a_fleet_up_killed_while_it_started(
        tmp_path: Path) -> None:
    mark = f"kvgate-test-{secrets.token_hex(6)}"
    state = tmp_path / "absent" / "fleet"
    # the engine listens where the fleet does not look for it: never ready
    up = subprocess.Popen(
        [sys.executable, "-m", "kvgate", "fleet", "up", "--replicas", "1", "--port", "0",
         "--state-dir", str(state), "--engine-arg=--host", "--engine-arg=127.0.0.2",
         f"--engine-arg=--served-by={mark}"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: engines_serving_as(mark) and list(state.glob("fleet*.json")), 30,
                   "the engine to start and be recorded")
        assert state.stat().st_mode & 0o777 == 0o700
        assert [p.name for p in state.glob("fleet*.json")] == ["fleet.starting.json"]
        up.send_signal(signal.SIGKILL)
        up.wait(timeout=10)
        assert engines_serving_as(mark)  # its own session: the kill did not reach it
        down = kvgate("fleet", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
        assert down.stdout == "stopped 1 processes\n"
        assert not engines_serving_as(mark)
        assert list(state.glob("fleet*.json")) == []
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        for pid in engines_serving_as(mark):
            os.kill(pid, signal.SIGKILL)
