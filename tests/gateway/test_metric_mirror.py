"""Per-worker counts summed over worker processes: two real processes in prometheus-client's
multiprocess mode each copy their own counts, and the summed exposition reads both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

WORKER = """
import sys
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from gateway.metric_mirror import MetricMirror

counts = {"sent": int(sys.argv[1]), "links": 1}

class Own:
    def collect(self):
        sent = CounterMetricFamily("kvgate_peer_frames_sent", "frames sent")
        sent.add_metric([], counts["sent"])
        links = GaugeMetricFamily("kvgate_peer_links_up", "links up")
        links.add_metric([], counts["links"])
        yield sent
        yield links

mirror = MetricMirror(CollectorRegistry())
mirror.add(Own())
counts["sent"] += int(sys.argv[2])  # sent more since: copied by its increase
mirror.copy()
mirror.copy()  # nothing new: nothing added
print("copied", flush=True)
sys.stdin.readline()  # alive until the test has read the sums
"""


def _samples(path: Path, labels: dict[str, str] | None = None) -> dict[str, float]:
    """The summed samples in ``path`` labelled ``labels`` (default: none)."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(path))
    return {s.name: s.value for family in registry.collect() for s in family.samples
            if s.labels == (labels or {})}


def test_each_workers_own_counts_are_summed(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(first), str(more)],
                                env=env, cwd=Path(__file__).parents[2], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
               for first, more in ((3, 2), (4, 0))]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline() == "copied\n"
        samples = _samples(tmp_path)
        assert samples["kvgate_peer_frames_sent_total"] == 9.0  # 3 + 2, and 4
        assert samples["kvgate_peer_links_up"] == 2.0  # the live workers' sum
    finally:
        for worker in workers:
            worker.communicate("\n", timeout=30)


CHURN = """
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics

fleet = Fleet([ReplicaConfig("r-live", "http://127.0.0.1:9")])
metrics = GatewayMetrics(fleet, ("affinity",))
metrics.request_done("r-live", "affinity", "200")
for i in range(40):  # a rollout after another: each pod named anew
    fleet.add(ReplicaConfig(f"pod-{i}", "http://127.0.0.1:9"))
    metrics.request_done(f"pod-{i}", "affinity", "200")
    metrics.first_byte(f"pod-{i}", 0.01)
    fleet.remove(f"pod-{i}")
metrics.request_done("r-live", "affinity", "200")  # written after the rewrites
"""


def test_replicas_that_left_leave_a_workers_metric_files(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", CHURN], env=env, cwd=Path(__file__).parents[2],
                   check=True, timeout=60)
    keys = [key for path in tmp_path.glob("*.db")
            for key, _, _, _ in MmapedDict.read_all_values_from_file(str(path))]
    assert keys and not [key for key in keys if "pod-" in key]
    assert sum(path.stat().st_size for path in tmp_path.iterdir()) <= 4 * 65536
    assert _samples(tmp_path, {"replica": "r-live", "route": "affinity", "status": "200"}
                    )["kvgate_requests_total"] == 2.0


KV_WORKER = """
import sys
from prometheus_client import generate_latest
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from policies.kv_index import KVIndex

class Subscriber:  # each worker reads every replica's stream: the same events
    messages, malformed, gaps, replays, replay_failures = int(sys.argv[1]), 0, 0, 0, 0
    index = KVIndex()

metrics = GatewayMetrics(Fleet([]))
metrics.watch_kv_events(Subscriber())
print("copied", flush=True)
sys.stdin.readline()  # the other worker has copied too
sys.stdout.write(generate_latest(metrics.exposed).decode())
"""


def test_counts_every_worker_keeps_of_the_same_events_are_the_largest_workers(
        tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    # started apart, the second worker missed a few of the stream's messages
    workers = [subprocess.Popen([sys.executable, "-c", KV_WORKER, str(messages)],
                                env=env, cwd=Path(__file__).parents[2], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
               for messages in (90, 100)]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline() == "copied\n"
    finally:
        pages = [worker.communicate("\n", timeout=30)[0] for worker in workers]
    for page in pages:  # whichever worker answers: neither the sum nor its own
        families = {f.name: f for f in text_string_to_metric_families(page)}
        messages = families["kvgate_kv_event_messages"]
        assert messages.type == "counter"
        assert [s.value for s in messages.samples if s.name.endswith("_total")] == [100.0]
