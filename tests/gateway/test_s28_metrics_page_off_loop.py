"""``GET /metrics``' page is written off the event loop: with 100 replicas writing it took
26 ms, with 8 worker processes' files of them 107 ms (``prometheus-client`` reads every
file at every scrape), and every request waited meanwhile. Only the collectors that read
the loop's own state (the fleet) run on it; what else the page holds is the same as
``exposed`` gives."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from tests.support.processes import REPO


class _Where(Collector):
    """A collector that notes the thread it was collected on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.threads: list[threading.Thread] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.current_thread())
        yield GaugeMetricFamily(self.name, "where it was collected", value=1)


def _samples(page: bytes) -> dict[str, float]:
    """The page's samples, less the process's own (which change between two reads)."""
    return {f"{s.name}{sorted(s.labels.items())}": s.value
            for family in text_string_to_metric_families(page.decode())
            for s in family.samples if not s.name.startswith("process_")}


def test_the_page_is_written_off_the_loop_and_the_live_collectors_run_on_it() -> None:
    fleet = Fleet([ReplicaConfig(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3)])
    metrics = GatewayMetrics(fleet)
    metrics.request_done("r1", metrics.routes[0], "200")
    steady, live = _Where("kvgate_test_steady"), _Where("kvgate_test_live")
    metrics.registry.register(steady)  # beside the counters and histograms
    metrics.export(live)  # reads live state, as the fleet's gauges do

    async def scrape() -> tuple[bytes, threading.Thread]:
        return await metrics.page(), threading.current_thread()

    page, loop_thread = asyncio.run(scrape())
    assert live.threads == [loop_thread]
    assert len(steady.threads) == 1 and steady.threads[0] is not loop_thread
    # the same page as the whole of ``exposed`` gives
    assert _samples(page) == _samples(generate_latest(metrics.exposed))
    got = _samples(page)
    route = metrics.routes[0]
    assert got[f"kvgate_requests_total[('replica', 'r1'), ('route', '{route}'), "
               "('status', '200')]"] == 1.0
    assert got["kvgate_replica_healthy[('replica', 'r2')]"] == 1.0


WORKER = """
import asyncio, sys
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics

fleet = Fleet([ReplicaConfig(r, "http://127.0.0.1:9") for r in ("a", "b")])
metrics = GatewayMetrics(fleet)
metrics.request_done(sys.argv[1], metrics.routes[0], "200")
fleet.remove("b")  # gone from the fleet: its series leave the page
sys.stdout.write(asyncio.run(metrics.page()).decode())
"""


def test_with_worker_files_the_page_sums_them_for_the_fleets_replicas(
        tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    pages = [subprocess.run([sys.executable, "-c", WORKER, replica], env=env, cwd=REPO,
                            check=True, timeout=60, capture_output=True, text=True).stdout
             for replica in ("a", "a", "b")]
    requests = [s for family in text_string_to_metric_families(pages[-1])
                if family.name == "kvgate_requests" for s in family.samples
                if s.name == "kvgate_requests_total" and s.value]
    assert [(s.labels["replica"], s.value) for s in requests] == [("a", 2.0)]
    assert "kvgate_replica_healthy{replica=\"a\"} 1.0" in pages[-1]
    assert not [line for line in pages[-1].splitlines() if 'replica="b"' in line]


TOP_WORKER = """
import asyncio, json, sys
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics

fleet = Fleet([ReplicaConfig(r, "http://127.0.0.1:9") for r in ("a", "b")])
metrics = GatewayMetrics(fleet)
for replica in sys.argv[1:]:
    metrics.request_done(replica, metrics.routes[0], "200")
metrics.request_done("none", metrics.routes[0], "503")
fleet.remove("b")
print(json.dumps([metrics.routes[0], asyncio.run(metrics.requests_by_replica())]))
"""


def test_kvgate_tops_counts_are_the_workers_files_summed(tmp_path: Path) -> None:
    # what /admin/top reads, on a thread: the files of every worker, for the fleet's replicas
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    outs = [subprocess.run([sys.executable, "-c", TOP_WORKER, *replicas], env=env, cwd=REPO,
                           check=True, timeout=60, capture_output=True, text=True).stdout
            for replicas in (("a", "b"), ("a", "a"))]
    route, counts = json.loads(outs[-1])
    assert counts == {"a": {route: 3}}
