"""With worker processes, the KV event index's drops copied per replica for /metrics
(``kvgate_kv_index_drops``) leave a worker's memory once the replica left: a fleet whose
pods are named anew at each rollout kept six series of each one that ever joined."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHURN = """
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from kvwire.kv_event_format import BlockStored
from policies.kv_index import KVIndex

class Subscriber:  # as a worker's: it reads every replica's stream
    messages, malformed, gaps, replays, replay_failures = 0, 0, 0, 0, 0
    index = KVIndex()

wrong = BlockStored((1,), None, tuple(range(32)), 32)  # not the index's block size
fleet = Fleet([ReplicaConfig("r-live", "http://127.0.0.1:9")])
metrics = GatewayMetrics(fleet)
metrics.watch_kv_events(Subscriber())
Subscriber.index.apply("r-live", 0, [wrong])
for i in range(20):  # a rollout after another: each pod named anew
    fleet.add(ReplicaConfig(f"pod-{i}", "http://127.0.0.1:9"))
    Subscriber.index.apply(f"pod-{i}", 0, [wrong])
    metrics.mirror.copy()
    fleet.remove(f"pod-{i}")
    Subscriber.index.remove_replica(f"pod-{i}")  # as the subscriber's next reconcile
    metrics.mirror.copy()
for family in metrics.registry.collect():  # the series this worker holds
    for sample in family.samples:
        if family.name == "kvgate_kv_index_drops":
            print(sample.labels["replica"], sample.labels["reason"], sample.value)
"""


def test_a_workers_copied_drops_of_replicas_that_left_are_forgotten(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    held = subprocess.run([sys.executable, "-c", CHURN], env=env,
                          cwd=Path(__file__).parents[2], check=True, timeout=60,
                          capture_output=True, text=True).stdout.splitlines()
    assert [line for line in held if line.startswith("pod-")] == []
    assert sorted(held) == sorted(
        f"r-live {reason} {1.0 if reason == 'wrong_block_size' else 0.0}"
        for reason in ("orphans", "keyed_elsewhere", "wrong_block_size", "gaps",
                       "restarts", "overflows"))
