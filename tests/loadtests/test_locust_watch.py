"""``watch_locust``: a signal that stopped the load run's Locust before the run's next
progress report still stops the run (``Stopped``), so a cut run's results are never
written as a whole run's; a Locust that ends on its own ends the watch."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from loadtests.run import StoppableProgress, Stopped, watch_locust


def _ended() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # ended before the watch's first look, as a Locust a Ctrl-C stopped
    return proc


def test_a_signal_that_ended_locust_first_stops_the_run() -> None:
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(Stopped):
        watch_locust(_ended(), StoppableProgress(cancelled), "cost", time.monotonic(), 60.0)


def test_a_locust_that_ends_on_its_own_ends_the_watch() -> None:
    seen: list[tuple[str, float, int | None]] = []
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    watch_locust(proc, lambda policy, elapsed, duration: seen.append(
        (policy, duration, proc.poll())), "cost", time.monotonic(), 60.0, every_s=0.05)
    assert proc.returncode == 0
    assert len(seen) >= 2 and seen[-1][:2] == ("cost", 60.0)
    # reports while it ran, and one more once it had ended
    assert seen[0][2] is None and seen[-1][2] == 0
