"""``python -m loadtests.run`` stopped by SIGTERM (a CI job's timeout, ``kill``): it stops its
Locust clients and its fleet, says so and exits 130. Python's default for SIGTERM ended it
at once, and the engines and the gateway, each in a session of its own, were left running
with nothing recording them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.processes import REPO


def _running(pid: int) -> bool:
    """Whether ``pid`` is still a fleet process (an exited one keeps no command line)."""
    try:
        return b"kvgate" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _naming(path: Path) -> list[int]:
    """The processes whose command line names ``path`` (the run's Locust: its ``--csv``)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path).encode() in (proc / "cmdline").read_bytes():
                out.append(int(proc.name))
        except OSError:  # gone meanwhile
            continue
    return out


def _fleet_pids(tmp: Path, run: subprocess.Popen[str]) -> list[int]:
    """The processes of the first policy's fleet, once it is ready (its state file)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and run.poll() is None:
        for state in tmp.glob("kvgate-run-*/fleet-*/fleet.json"):
            try:
                return [int(p["pid"]) for p in json.loads(state.read_text())["processes"]]
            except ValueError:  # being written
                continue
        time.sleep(0.02)
    raise AssertionError(f"no fleet came up (exit {run.poll()})")


def test_sigterm_while_the_load_runs_stops_the_fleet(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path))  # where the run keeps its fleet's files
    run = subprocess.Popen(
        [sys.executable, "-m", "loadtests.run", "--policies", "round_robin,cost",
         "--duration", "30", "--replicas", "1", "--kv-cache-gib", "0.5",
         "--max-num-seqs", "4"],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = _fleet_pids(tmp_path, run)
        assert len(pids) == 2  # the engine and the gateway
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 130, err[-2000:]
        assert err.endswith("\nstopped\n") and "Traceback" not in err
        assert [pid for pid in pids if _running(pid)] == []
        assert _naming(tmp_path) == []  # nor Locust
        assert list(tmp_path.glob("kvgate-run-*")) == []  # its files went with it
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in {*pids, *_naming(tmp_path)}:  # what it left running
            if _running(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
