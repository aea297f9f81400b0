"""The supervisor of ``serve --workers N`` stops its box: a worker that outlives the
drain's time is killed, so no worker is left running after the supervisor; a box that
began draining because a worker exited drains on through the operator's first signal."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event


def _stuck(ready: Event) -> None:
    """A worker deaf to the stop (its event loop blocked, say)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    time.sleep(60)


def _exits(ready: Event) -> None:
    ready.wait(60)
    sys.exit(3)


def _counts_stops(ready: Event, stops: Synchronized, release: Event) -> None:
    """A worker that counts the SIGTERMs it gets, and ends once released."""
    def told(sig: int, frame: object) -> None:
        with stops.get_lock():
            stops.value += 1

    signal.signal(signal.SIGTERM, told)
    ready.set()
    release.wait(60)


def test_the_operators_first_signal_after_a_worker_exited_does_not_cut_the_drain() -> None:
    from gateway.config import GatewayConfig, ShutdownConfig
    from gateway.workers import Supervisor
    from tests.support.waiting import wait_until

    supervisor = Supervisor(GatewayConfig(shutdown=ShutdownConfig(grace_s=0.0, timeout_s=30)),
                            2, "INFO")
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    stops = ctx.Value("i", 0)
    supervisor.procs = [
        ctx.Process(target=_counts_stops, args=(ready, stops, release), name="kvgate-worker-0"),
        ctx.Process(target=_exits, args=(ready,), name="kvgate-worker-1")]
    for proc in supervisor.procs:
        proc.start()
    waiter = threading.Thread(target=lambda: statuses.append(supervisor.wait()))
    statuses: list[int] = []
    waiter.start()
    try:
        wait_until(lambda: stops.value == 1, 60)  # the box drains: one SIGTERM
        supervisor._signalled(signal.SIGTERM, None)  # the operator's first: the same drain
        time.sleep(1.2)  # the supervisor's loop looks at least once a second
        assert stops.value == 1
        supervisor._signalled(signal.SIGTERM, None)  # the second: at once
        wait_until(lambda: stops.value == 2, 60)
        release.set()
        waiter.join(60)
        assert statuses == [1]  # a worker exited on its own
        assert [proc.exitcode for proc in supervisor.procs] == [0, 3]
    finally:
        release.set()
        for proc in supervisor.procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        waiter.join(60)


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
