"""Real ``python -m kvgate`` processes, stopped together when a test ends."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from tests.support.waiting import wait_http

REPO = Path(__file__).resolve().parents[2]

Process = subprocess.Popen[bytes]


class Processes:
    """Starts ``kvgate`` commands; ``stop_all`` ends every one it started."""

    def __init__(self) -> None:
        self.started: list[Process] = []

    def __call__(self, *args: str, ready_url: str | None = None, timeout_s: float = 60.0
                 ) -> Process:
        """Run ``python -m kvgate ARGS``; with ``ready_url``, wait until it answers 200 (on
        failure, raise with the tail of the process's stderr)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-m", "kvgate", *args], cwd=REPO,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.started.append(proc)
        if ready_url is not None:
            self.wait_ready(proc, ready_url, timeout_s, args)
        return proc

    @staticmethod
    def wait_ready(proc: Process, url: str, timeout_s: float, args: tuple[str, ...] = ()
                   ) -> None:
        try:
            wait_http(url, timeout_s, proc)
        except (RuntimeError, AssertionError):
            proc.kill()
            _, err = proc.communicate(timeout=10)
            raise RuntimeError(f"kvgate {' '.join(args)} failed:\n{err.decode()[-3000:]}")\
                from None

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            if proc.poll() is None:
                proc.kill()
            if proc.stderr is not None:
                proc.stderr.close()
