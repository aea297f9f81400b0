"""Engines that export their KV usage but not their capacity (``--no-cache-config-info``)
behind a real gateway: after some streamed traffic through it (the official ``openai``
client), the gateway's estimate of each replica's capacity is within 15% of the truth,
routing uses it, and ``/admin`` and ``/metrics`` say it was estimated. Engines that export
it keep their scraped figure, and the estimate made alongside agrees with it."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.cost_model import load_profile
from engine.kv_sizing import blocks_in_gib
from kvwire.tokenizer_build import sample_text
from tests.support.fleets import SIM_ENGINE, EngineFleet, start_fleet
from tests.support.processes import Processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
T = TypeVar("T")


def true_capacity_tokens() -> int:
    """What ``SIM_ENGINE`` holds: 1 GiB of KV of the default profile, in whole blocks."""
    gib = float(SIM_ENGINE[SIM_ENGINE.index("--kv-cache-gib") + 1])
    kv_bytes = load_profile("llama3-8b-h100").model.kv_bytes_per_token
    return blocks_in_gib(gib, kv_bytes, BLOCK_SIZE) * BLOCK_SIZE


def replicas(fleet: EngineFleet) -> dict[str, dict[str, Any]]:
    listing = httpx.get(f"{fleet.admin}/admin/replicas", headers=fleet.admin_headers).json()
    return {r["id"]: r for r in listing["replicas"]}


def streamed_traffic_until(fleet: EngineFleet, done: Callable[[], T]) -> tuple[T, list[int]]:
    """Four clients stream completions through the gateway until ``done()`` returns
    something truthy (within 90 s); that, and the output tokens of each answer."""
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0)
    stop = threading.Event()
    answered: list[int] = []

    def traffic(worker: int) -> None:
        rng = random.Random(worker)
        while not stop.is_set():
            # a document of its own each time: no two running prompts share blocks
            stream = client.completions.create(
                model="sim-llama", prompt=sample_text(rng, rng.randint(150, 400)),
                max_tokens=48, stream=True, stream_options={"include_usage": True})
            usage = [chunk.usage for chunk in stream if chunk.usage is not None]
            answered.append(usage[-1].completion_tokens)

    with ThreadPoolExecutor(4) as pool:
        workers = [pool.submit(traffic, i) for i in range(4)]
        try:
            got = wait_until(done, 90, "the capacity figures")
        finally:
            stop.set()
        for worker in workers:
            worker.result()
    return got, answered


def test_capacity_is_estimated_from_usage_within_15_percent(spawn: Processes,
                                                            tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "round_robin"},
                        engine=(*SIM_ENGINE, "--no-cache-config-info"))
    assert {r["kv_capacity_source"] for r in replicas(fleet).values()} == {None}

    def all_estimated() -> dict[str, dict[str, Any]] | None:
        listed = replicas(fleet)
        done = all(r["kv_capacity_source"] == "estimated"
                   and r["kv_capacity_estimate"]["ratio_learned"] for r in listed.values())
        return listed if done else None

    listed, answered = streamed_traffic_until(fleet, all_estimated)
    assert len(answered) >= 8 and set(answered) == {48}
    truth = true_capacity_tokens()
    for rid, r in listed.items():
        estimate = r["kv_capacity_replica_tokens"]
        assert abs(estimate - truth) <= 0.15 * truth, (rid, estimate, truth)
        assert r["kv_capacity_estimate"]["samples"] >= 3
        # what policies see, in gateway tokens
        ratio = r["replica_tokens_per_gateway_token"]
        assert abs(r["kv_capacity_tokens"] - estimate / ratio) <= 1
    text = httpx.get(f"{fleet.gateway}/metrics").text
    gauges = {(s.labels["replica"], s.labels["source"]): s.value
              for family in text_string_to_metric_families(text) for s in family.samples
              if s.name == "kvgate_replica_kv_capacity_replica_tokens"}
    assert set(gauges) == {("r0", "estimated"), ("r1", "estimated")}
    for (rid, _), value in gauges.items():
        assert abs(value - truth) <= 0.15 * truth, (rid, value)


def test_a_scraped_capacity_wins_and_the_estimate_agrees_with_it(spawn: Processes,
                                                                 tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "round_robin"})
    truth = true_capacity_tokens()

    def all_estimated() -> dict[str, dict[str, Any]] | None:
        listed = replicas(fleet)
        done = all(r["kv_capacity_estimate"]["replica_tokens"]
                   and r["kv_capacity_estimate"]["ratio_learned"] for r in listed.values())
        return listed if done else None

    listed, _ = streamed_traffic_until(fleet, all_estimated)
    for rid, r in listed.items():
        assert r["kv_capacity_source"] == "scraped"
        assert r["kv_capacity_replica_tokens"] == truth  # the gauge, never the estimate
        estimate = r["kv_capacity_estimate"]["replica_tokens"]
        assert abs(estimate - truth) <= 0.15 * truth, (rid, estimate, truth)
