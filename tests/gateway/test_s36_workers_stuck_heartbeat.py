"""A worker of ``serve --workers N`` whose event loop is stuck (stopped here, SIGSTOP)
keeps its share of the port's new connections and answers none: the supervisor, hearing
no heartbeat from it, kills it, names it and stops the box (exit 1), as when a worker
exits on its own."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.workers import Supervisor
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.marked_processes import children, is_worker
from tests.support.processes import Processes
from tests.support.servers import ThreadServer, free_port
from tests.support.waiting import wait_until

SILENT_ENV = "KVGATE_WORKER_SILENT_S"  # the bound on a worker's silence, in seconds


def test_a_worker_whose_loop_is_stuck_is_killed_and_its_box_stops(
        spawn: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SILENT_ENV, "1.5")  # the box inherits it
    replica = ThreadServer(fake_replica(Behaviour("r0"))).start()
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "replicas": [{"id": "r0", "url": replica.url}],
        "shutdown": {"grace_s": 0, "timeout_s": 1}}))
    stopped: list[int] = []
    try:
        box = spawn("serve", "--config", str(config), "--workers", "2")
        answered: set[str] = set()

        def both_serve() -> bool:  # each has answered, so each has beaten
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/metrics",
                                headers={"connection": "close"}, timeout=2)
                answered.add(got.headers.get("x-kvgate-worker", ""))
            except httpx.TransportError:  # not listening yet
                pass
            return {"0", "1"} <= answered

        wait_until(both_serve, 60, "both workers to answer")
        stuck = max(pid for pid in children(box.pid) if is_worker(pid))
        os.kill(stuck, signal.SIGSTOP)
        stopped.append(stuck)
        assert box.wait(30) == 1
        assert box.stderr is not None
        err = box.stderr.read().decode()
        assert f"(pid {stuck}) silent for " in err, err
        assert "no heartbeat within 1.5 s); killed" in err, err
    finally:
        for pid in stopped:  # let it end however the test ended
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        replica.stop()


def test_the_heartbeats_bound_is_a_number_of_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.config import GatewayConfig

    monkeypatch.delenv(SILENT_ENV, raising=False)
    assert Supervisor(GatewayConfig(), 2, "INFO").silent_s == 10.0
    for bad in ("0.5", "ten", "nan", "inf", ""):
        monkeypatch.setenv(SILENT_ENV, bad)
        with pytest.raises(ValueError, match=f"{SILENT_ENV} must be a number of seconds "
                           rf">= 1 \(a worker beats every 0.5 s\), got '{bad}'"):
            Supervisor(GatewayConfig(), 2, "INFO")


class _Worker:
    """Stands in for a worker process: records that it was killed."""

    def __init__(self, index: int) -> None:
        self.name = f"kvgate-worker-{index}"
        self.pid = 1000 + index
        self.killed = False

    def kill(self) -> None:
        self.killed = True


def test_a_box_paused_whole_is_not_taken_for_stuck_workers(
        capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from gateway.config import GatewayConfig
    from gateway.shared_load import SharedBlock
    from gateway.workers import Heartbeats

    block = SharedBlock.create("test-beats", Heartbeats.size(2))
    try:
        supervisor = Supervisor(GatewayConfig(), 2, "INFO", silent_s=5.0)
        supervisor.beats = beats = Heartbeats(block, 2)
        workers = [_Worker(0), _Worker(1)]
        supervisor.procs = workers  # type: ignore[assignment]
        beats.beat(0)
        supervisor._kill_silent()  # worker 0 heard; worker 1 still starting: not watched
        # the supervisor looked last a minute ago (the whole box was paused): no silence
        now = time.monotonic()
        supervisor._heard[0] = (1, now - 60)
        supervisor._looked_at = now - 60
        supervisor._kill_silent()
        assert not workers[0].killed
        # a minute of silence the supervisor saw, looking every second
        supervisor._heard[0] = (1, now - 60)
        supervisor._looked_at = time.monotonic() - 1
        supervisor._kill_silent()
        assert workers[0].killed and not workers[1].killed
        assert "kvgate-worker-0 (pid 1000) silent for 60." in capsys.readouterr().err
    finally:
        block.close()
