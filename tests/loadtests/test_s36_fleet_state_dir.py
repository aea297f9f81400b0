"""The local fleet's state directory: ``kvgate fleet up`` uses a directory that is this
user's alone and writes nothing through a link there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests import local_fleet
from tests.support.processes import REPO

pytestmark = pytest.mark.slow

NOBODY = 65534


def kvgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvgate", *args], capture_output=True,
                          text=True, timeout=120, check=False, cwd=REPO)


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
