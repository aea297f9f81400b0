"""A fleet record an older kvgate wrote (no start times) still stops its fleet: ``fleet
down`` signals the recorded ``python -m kvgate`` processes, as that version did, and a
record without start times naming another program's process leaves it alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from loadtests.local_fleet import STATE_FILE, stop_recorded


def _record(state: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    state.mkdir(mode=0o700)
    (state / STATE_FILE).write_text(json.dumps({"processes": [
        {"name": f"p{i}", "pid": p.pid} for i, p in enumerate(procs)]}))


def test_an_older_record_stops_its_kvgate_processes(tmp_path: Path) -> None:
    # stand-ins: one whose command line reads ``-m kvgate`` as the older fleet's did,
    # one of another program
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                "-m", "kvgate"], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        _record(tmp_path / "state", [sleeper, other])
        stopped = stop_recorded(tmp_path / "state", grace_s=5)
        assert stopped.recorded and stopped.stopped == 1, stopped
        assert sleeper.wait(timeout=10) != 0  # ended by the signal
        assert other.poll() is None and stopped.gone == (other.pid,)
        assert not (tmp_path / "state" / STATE_FILE).exists()
    finally:
        for p in (sleeper, other):
            p.kill()
            p.wait()
