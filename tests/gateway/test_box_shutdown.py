"""The supervisor of ``serve --workers N`` stops its box: a worker that outlives the
drain's time is killed, so no worker is left running after the supervisor."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import time
from multiprocessing.synchronize import Event


def _stuck(ready: Event) -> None:
    """A worker deaf to the stop (its event loop blocked, say)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def _exits(ready: Event) -> None:
    ready.wait(60)
    sys.exit(3)


def test_a_worker_still_running_past_the_stop_is_killed() -> None:
    # imported here: the spawned workers import this module, and need none of it
    from gateway.config import GatewayConfig, ShutdownConfig
    from gateway.workers import Supervisor

    supervisor = Supervisor(GatewayConfig(shutdown=ShutdownConfig(grace_s=0.0, timeout_s=0.1)),
                            2, "INFO")
    supervisor.kill_after_s = 0.0
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    # one worker exits on its own: the supervisor stops the other, which never stops
    supervisor.procs = [ctx.Process(target=target, args=(ready,), name=f"kvgate-worker-{i}")
                        for i, target in enumerate((_stuck, _exits))]
    for proc in supervisor.procs:
        proc.start()
    try:
        assert supervisor.wait() == 1
        assert [proc.exitcode for proc in supervisor.procs] == [-signal.SIGKILL, 3]
    finally:
        for proc in supervisor.procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
