"""SIGTERM drains the gateway: readiness goes down at once, requests are served through
the grace period, every stream in flight completes, and the process exits in time."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.fleets import SIM_ENGINE
from tests.support.processes import Process, Processes
from tests.support.servers import ThreadServer, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_sigterm_drains_with_streams_in_flight(spawn: Processes, tmp_path: Path) -> None:
    eport, gport = free_port(), free_port()
    spawn("engine", *SIM_ENGINE, "--port", str(eport),
          ready_url=f"http://127.0.0.1:{eport}/health", timeout_s=120)
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": gport, "replicas": [{"id": "r0", "url": f"http://127.0.0.1:{eport}"}],
        "shutdown": {"grace_s": 1.5, "timeout_s": 30}}))
    url = f"http://127.0.0.1:{gport}"
    gateway = spawn("serve", "--config", str(config), ready_url=f"{url}/ready")
    ends: list[str] = []
    started = threading.Semaphore(0)

    def stream(i: int) -> None:
        body = {"model": "sim-llama", "prompt": f"drain {i}", "max_tokens": 200,
                "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            last = ""
            for n, line in enumerate(r.iter_lines()):
                if n == 0:
                    started.release()
                if line.startswith("data: "):
                    last = line
        ends.append(last)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for _ in threads:
        assert started.acquire(timeout=30)
    signalled = time.monotonic()
    gateway.send_signal(signal.SIGTERM)
    wait_until(lambda: httpx.get(f"{url}/ready").status_code == 503, 1, "/ready to go down")
    assert httpx.get(f"{url}/health").status_code == 200
    late = httpx.post(f"{url}/v1/completions", timeout=30,
                      json={"model": "sim-llama", "prompt": "late", "max_tokens": 2})
    assert late.status_code == 200  # still served during the grace period
    for t in threads:
        t.join(60)
    assert ends == ["data: [DONE]"] * 20
    # uvicorn re-raises the signal once it has stopped, so the exit status names it
    assert gateway.wait(timeout=30) in (0, -signal.SIGTERM)
    assert time.monotonic() - signalled < 30


def endless_stream(spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path,
                   held: threading.Event, **config: Any
                   ) -> tuple[Process, str, list[str], threading.Thread]:
    """A gateway (``config`` on top of one replica whose streams never end until ``held``
    is set) with one stream under way: the process, its URL, the stream's lines so far,
    and the thread reading them."""
    replica = serve(fake_replica(Behaviour("r0", release=held)))
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "port": port, "replicas": [{"id": "r0", "url": replica.url}], **config}))
    url = f"http://127.0.0.1:{port}"
    gateway = spawn("serve", "--config", str(path), ready_url=f"{url}/ready")
    lines: list[str] = []
    started = threading.Semaphore(0)

    def stream() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.stream(
                "POST", f"{url}/v1/completions", timeout=60,
                json={"model": "sim-model", "prompt": "x", "stream": True}) as r:
            for line in r.iter_lines():
                started.release()
                lines.append(line)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    assert started.acquire(timeout=30)
    return gateway, url, lines, thread


def test_a_second_signal_stops_at_once_with_answers_in_flight(
        spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path) -> None:
    held = threading.Event()
    try:
        gateway, url, _, _ = endless_stream(spawn, serve, tmp_path, held,
                                            shutdown={"grace_s": 1, "timeout_s": 60})
        gateway.send_signal(signal.SIGTERM)
        wait_until(lambda: httpx.get(f"{url}/ready").status_code == 503, 5, "draining")
        signalled = time.monotonic()
        gateway.send_signal(signal.SIGTERM)  # the operator does not want to wait
        gateway.wait(timeout=30)
        assert time.monotonic() - signalled < 5  # not the time the answer could take
        assert gateway.stderr is not None
        err = gateway.stderr.read().decode()
        assert "stopping at once" in err and "Traceback" not in err, err  # quietly
    finally:
        held.set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_streams_that_outlast_the_shutdown_end_visibly_cut(
        spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path,
        sig: signal.Signals) -> None:
    held = threading.Event()
    # the gateway starts with SIGHUP's default action (a handler here is reset to it in the
    # child; an ignored SIGHUP, as under nohup, would stay ignored there)
    before = signal.signal(signal.SIGHUP, lambda *_: None)
    try:
        gateway, _, lines, thread = endless_stream(
            spawn, serve, tmp_path, held, access_log=True,
            shutdown={"grace_s": 0.5, "timeout_s": 3})
        signal.signal(signal.SIGHUP, before)
        # SIGHUP (a closed terminal) drains as SIGTERM does; it stopped the process at once
        gateway.send_signal(sig)
        thread.join(30)
        assert not thread.is_alive()
        # ended by the gateway before uvicorn's own cancel: an error event, no [DONE]
        events = [line for line in lines if line.startswith("data: ")]
        assert "gateway_shutdown" in events[-1] and "data: [DONE]" not in events
        gateway.wait(timeout=30)
        assert gateway.stderr is not None
        records = [json.loads(line[line.index("{"):])
                   for line in gateway.stderr.read().decode().splitlines()
                   if '"status"' in line]
        assert [r["status"] for r in records] == ["503"]  # counted cut, not 200
    finally:
        signal.signal(signal.SIGHUP, before)
        held.set()


def test_a_request_still_waiting_for_its_first_byte_at_the_cutoff_gets_a_503(
        spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path) -> None:
    """Uvicorn cancels what is left when the shutdown's time is up: a request still
    waiting for its replica's first byte got its plain-text 500, uncounted, with a
    traceback in the log. The gateway ends it first, as an OpenAI 503."""
    held = threading.Event()
    behaviour = Behaviour("r0", hold=held)
    replica = serve(fake_replica(behaviour))
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "port": port, "replicas": [{"id": "r0", "url": replica.url}], "access_log": True,
        "shutdown": {"grace_s": 0.5, "timeout_s": 3}}))
    url = f"http://127.0.0.1:{port}"
    gateway = spawn("serve", "--config", str(path), ready_url=f"{url}/ready")
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{url}/v1/completions", timeout=60, json={"model": "sim-model", "prompt": "x"})))
    try:
        thread.start()
        wait_until(lambda: len(behaviour.received) == 1, 10,
                   "the request to reach the replica")
        gateway.send_signal(signal.SIGTERM)
        thread.join(30)
        assert [a.status_code for a in answers] == [503]
        assert answers[0].json()["error"]["code"] == "gateway_shutdown"
        gateway.wait(timeout=30)
        assert gateway.stderr is not None
        err = gateway.stderr.read().decode()
        assert "Traceback" not in err, err
        records = [json.loads(line[line.index("{"):]) for line in err.splitlines()
                   if '"status"' in line]
        assert [r["status"] for r in records] == ["503"]
    finally:
        held.set()
