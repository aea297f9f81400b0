"""``kvgate serve --workers 2``: two gateway processes on one port that route on the whole
box's load, answer /metrics for both, apply admin changes together and drain together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.support.binaries import which
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.held_streams import held_stream
from tests.support.metrics import per_worker
from tests.support.processes import Process, Processes
from tests.support.servers import ThreadServer, free_port
from tests.support.waiting import wait_http, wait_until

pytestmark = pytest.mark.slow

TOKEN = "admin-token-for-tests-0123"


def _gauge(samples: dict[Any, float], name: str, replica: str) -> float | None:
    return samples.get((name, (("replica", replica),)))


class Box:
    def __init__(self, proc: Process, url: str, admin: str) -> None:
        self.proc, self.url, self.admin = proc, url, admin


@pytest.fixture
def box(request: pytest.FixtureRequest, spawn: Processes,
        serve: Callable[..., ThreadServer], tmp_path: Path) -> tuple[Box, Behaviour]:
    """Two workers in front of one fake replica; the shutdown grace in seconds is the
    fixture's parameter (0 unless a test asks: each stop waits it out)."""
    behaviour = Behaviour("r0", chunks=2)
    replica = serve(fake_replica(behaviour))
    port, admin_port = free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "policy": {"name": "least_load"},
        "replicas": [{"id": "r0", "url": replica.url}],
        "health": {"interval_s": 0.2},
        "admin": {"token": TOKEN, "port": admin_port, "allow_hosts": ["127.0.0.1"]},
        "shutdown": {"grace_s": getattr(request, "param", 0), "timeout_s": 20}}))
    url = f"http://127.0.0.1:{port}"
    proc = spawn("serve", "--config", str(config), "--workers", "2", ready_url=f"{url}/ready")
    # the first worker up answers everything until the second listens too
    per_worker(url, lambda s: True, "both workers to listen")
    return Box(proc, url, f"http://127.0.0.1:{admin_port}"), behaviour


def test_each_worker_sees_the_others_pending_tokens(box: tuple[Box, Behaviour]) -> None:
    gateway, behaviour = box
    with held_stream(behaviour, gateway.url) as chunks:
        # the replica holds its first byte: both workers must count the request, though
        # only one of them routed it
        seen = per_worker(gateway.url, lambda s: (
            _gauge(s, "kvgate_replica_in_flight", "r0") == 1
            and (_gauge(s, "kvgate_replica_queued_tokens", "r0") or 0) > 200),
            "both workers to see the request held at r0")
        queued = {w: _gauge(s, "kvgate_replica_queued_tokens", "r0") for w, s in seen.items()}
        assert queued["0"] == queued["1"]
        assert not chunks  # no byte had come back
    assert chunks == ["t0 ", "t1 "]
    per_worker(gateway.url, lambda s: _gauge(s, "kvgate_replica_in_flight", "r0") == 0
                and _gauge(s, "kvgate_replica_queued_tokens", "r0") == 0,
                "both workers to see it answered")


def test_metrics_sum_both_workers(box: tuple[Box, Behaviour]) -> None:
    gateway, _ = box
    served: dict[str, int] = {}
    for i in range(24):
        # a new connection each: the kernel spreads them over the workers
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused",
                           http_client=httpx.Client(), max_retries=0) as one:
            raw = one.completions.with_raw_response.create(model="sim-model",
                                                           prompt=f"q{i}", max_tokens=2)
        worker = raw.headers["x-kvgate-worker"]
        served[worker] = served.get(worker, 0) + 1
        assert raw.parse().choices[0].text == "r0 ok"
    assert set(served) == {"0", "1"}, served

    def requests_total(s: dict[Any, float]) -> float:
        return sum(v for (name, labels), v in s.items()
                   if name == "kvgate_requests_total" and ("status", "200") in labels)

    per_worker(gateway.url, lambda s: requests_total(s) == 24,
                "both workers' /metrics to count all 24 requests")
    # the live collectors (fleet, KV capacity) are served beside the summed figures too
    capacity = ("kvgate_replica_kv_capacity_replica_tokens",
                (("replica", "r0"), ("source", "scraped")))
    per_worker(gateway.url, lambda s: s.get(capacity) == 16 * 1000,
                "both workers' /metrics to show r0's scraped KV capacity")
    # the admin API (worker 0's) counts the box's requests, not its own worker's
    top = httpx.get(f"{gateway.admin}/admin/top",
                    headers={"authorization": f"Bearer {TOKEN}"}).json()
    assert [r["requests"] for r in top["replicas"]] == [24]


def test_admin_changes_reach_both_workers(box: tuple[Box, Behaviour],
                                          serve: Callable[..., ThreadServer]) -> None:
    gateway, _ = box
    other = serve(fake_replica(Behaviour("r1")))
    auth = {"authorization": f"Bearer {TOKEN}"}
    added = httpx.post(f"{gateway.admin}/admin/replicas", headers=auth,
                       json={"id": "r1", "url": other.url})
    assert added.status_code == 201, added.text
    per_worker(gateway.url, lambda s: _gauge(s, "kvgate_replica_healthy", "r1") == 1.0,
                "both workers to have r1, healthy")
    removed = httpx.delete(f"{gateway.admin}/admin/replicas/r1", headers=auth)
    assert removed.status_code == 200, removed.text
    # every series of r1 leaves (the workers' metric files keep what r1's counters wrote:
    # the summed page leaves out replicas that left)
    per_worker(gateway.url, lambda s: not any(("replica", "r1") in labels for _, labels in s)
                and _gauge(s, "kvgate_replica_healthy", "r0") == 1.0,
                "both workers to drop r1")


@pytest.mark.parametrize("box", [5], indirect=True)
def test_sigterm_drains_every_worker(box: tuple[Box, Behaviour]) -> None:
    gateway, behaviour = box
    behaviour.hold = threading.Event()
    ends: list[str] = []

    def stream() -> None:
        body = {"model": "sim-model", "prompt": "drain", "max_tokens": 2, "stream": True}
        with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body,
                          timeout=30) as r:
            ends.extend(line for line in r.iter_lines() if line.startswith("data: "))

    thread = threading.Thread(target=stream)
    thread.start()
    wait_until(lambda: behaviour.received, 10, "the request to reach the replica")
    gateway.proc.send_signal(signal.SIGTERM)
    # each request a new connection, which the kernel hands to either worker: 24 in a row
    # answered 503 would pass by chance 1 time in 2**24 with one worker still ready (the
    # grace period keeps both listening meanwhile)
    wait_until(lambda: all(httpx.get(f"{gateway.url}/ready",
                                     headers={"connection": "close"}).status_code == 503
                           for _ in range(24)), 5, "/ready to go down on every worker")
    behaviour.hold.set()
    thread.join(30)
    assert ends[-1] == "data: [DONE]"
    assert gateway.proc.wait(timeout=30) == 0


def test_workers_serve_when_the_supervisor_is_process_1(
        serve: Callable[..., ThreadServer], tmp_path: Path) -> None:
    # as in a container whose entry point is `kvgate serve` with no init: the supervisor
    # is process 1 of its PID namespace (the network is the host's)
    unshare = which("unshare", "Debian's util-linux")
    if unshare is None:
        pytest.skip("unshare is not installed")
    refused = subprocess.run([unshare, "-Urpf", "true"], capture_output=True)
    if refused.returncode != 0:
        if os.environ.get("KVGATE_REQUIRE_BINARIES"):  # CI runs it: a skip would hide it
            raise RuntimeError(f"unshare -Urpf failed: {refused.stderr.decode()[-300:]}")
        pytest.skip("this sandbox refuses a new PID namespace")
    replica = serve(fake_replica(Behaviour("r0")))
    port = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"port": port, "replicas": [
        {"id": "r0", "url": replica.url}], "health": {"interval_s": 0.2}}))
    proc = subprocess.Popen(
        [unshare, "-Urpf", "--kill-child", sys.executable, "-m", "kvgate", "serve",
         "--config", str(config), "--workers", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/ready", 60, proc)
        per_worker(url, lambda s: proc.poll() is None, "both workers to listen")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        model = client.models.list().data[0].id
        answer = client.completions.create(model=model, prompt="hello", max_tokens=2)
        assert answer.choices
        assert proc.poll() is None  # every worker still serving
    finally:
        proc.kill()  # its PID 1 goes with it (--kill-child), and the workers with that
        _, err = proc.communicate(timeout=30)
    assert b"exited with" not in err, err.decode()[-2000:]


@pytest.mark.parametrize("told", [True, False])
def test_a_route_either_worker_makes_teaches_the_other(
        spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path,
        told: bool) -> None:
    """cost's cache model in worker 0 (the admin API's) holds a document that worker 1
    routed: the workers tell each other their routes (``worker_routes``), unless
    ``--no-worker-routes``."""
    replicas = [serve(fake_replica(Behaviour(f"r{i}"))) for i in range(3)]
    port, admin_port = free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "policy": {"name": "cost"},
        "replicas": [{"id": f"r{i}", "url": r.url} for i, r in enumerate(replicas)],
        "health": {"interval_s": 0.2},
        "admin": {"token": TOKEN, "port": admin_port, "allow_hosts": ["127.0.0.1"]},
        "shutdown": {"grace_s": 0}}))
    url, admin = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}"
    spawn("serve", "--config", str(config), "--workers", "2",
          *(() if told else ("--no-worker-routes",)), ready_url=f"{url}/ready")
    per_worker(url, lambda s: True, "both workers to listen")
    headers = {"authorization": f"Bearer {TOKEN}"}

    def held(prompt: str, replica: str) -> float:
        """The share of ``prompt`` worker 0's policy predicts ``replica`` holds."""
        r = httpx.post(f"{admin}/admin/explain", headers=headers,
                       json={"model": "sim-model", "prompt": prompt, "max_tokens": 2}).json()
        return sum(s["matched_tokens"] for s in r["scores"]
                   if s["replica"] == replica) / r["prompt_tokens"]

    for i in range(60):
        doc = " ".join(f"clause{i}x{j} of contract {i} reads plainly" for j in range(60))
        with httpx.Client() as http:  # a new connection: the kernel picks the worker
            r = http.post(f"{url}/v1/completions",
                          json={"model": "sim-model", "prompt": doc, "max_tokens": 2})
        assert r.status_code == 200, r.text
        if r.headers["x-kvgate-worker"] == "1":
            break
    else:
        pytest.fail("no request of 60 reached worker 1")
    replica = r.headers["x-kvgate-replica"]
    if not told:
        time.sleep(0.5)  # a told route arrives within a few ms
        assert held(doc, replica) == 0.0
        return
    wait_until(lambda: held(doc, replica) > 0.9, 10,
               f"worker 0 to learn that worker 1 sent the document to {replica}")
    per_worker(url, lambda s: s.get(("kvgate_worker_routes_received_total", ()), 0) >= 1,
               "the box's /metrics to count the route told")
