"""``kv_events`` end to end: two sim engines publishing KV events over ZMQ, the gateway
subscribed to both, the official OpenAI client in front."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kvwire.tokenizer_build import sample_text
from tests.support.fleets import EngineFleet, start_fleet
from tests.support.processes import Processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
MODEL = "sim-llama"


def test_a_repeated_document_goes_where_its_blocks_are(spawn: Processes, tmp_path: Path
                                                        ) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "kv_events"}, kv_events=True)
    assert all(r.kv_events for r in fleet.replicas)
    with httpx.Client(timeout=30) as http, openai.OpenAI(
            base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0) as client:
        check_routing(http, client, fleet)


def check_routing(http: httpx.Client, client: openai.OpenAI, fleet: EngineFleet) -> None:

    def explain(prompt: str) -> dict[str, Any]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
        return http.post(f"{fleet.admin}/admin/explain", json=body,
                         headers=fleet.admin_headers).json()

    def matched(prompt: str, replica: str) -> int:
        return next(s["matched_tokens"] for s in explain(prompt)["scores"]
                    if s["replica"] == replica)

    rng = random.Random(7)
    # Each replica caches a warm-up text sent to it directly, until the gateway sees it:
    # a subscriber only receives what is published after it has joined.
    for replica in fleet.replicas:
        warm = sample_text(rng, 120)

        def send(url: str = replica.url, warm: str = warm) -> None:
            http.post(f"{url}/v1/completions",
                      json={"model": MODEL, "prompt": warm, "max_tokens": 1}).raise_for_status()

        send()
        wait_until(lambda rid=replica.id, warm=warm: matched(warm, rid), 15,
                   f"{replica.id} to report its blocks", retry=send)

    doc = sample_text(rng, 300)
    first = client.completions.with_raw_response.create(model=MODEL, prompt=doc, max_tokens=4)
    home = first.headers["x-kvgate-replica"]
    decision = wait_until(lambda: (d := explain(doc))["matched_tokens"] > 0 and d, 15,
                          "the document's blocks to be indexed")
    assert decision["chosen"] == home and decision["reason"] == "cache_match"
    assert decision["policy"] == "kv_events"
    assert decision["matched_tokens"] >= 400  # the ~500-token document, whole blocks

    second = client.completions.with_raw_response.create(model=MODEL, prompt=doc, max_tokens=4)
    assert second.headers["x-kvgate-replica"] == home
    assert second.headers["x-kvgate-route"] == "cache_match"
    usage = second.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == decision["matched_tokens"]

    # A cache reset on an idle engine is published too (AllBlocksCleared).
    http.post(f"{fleet.replica(home).url}/reset_prefix_cache").raise_for_status()
    wait_until(lambda: explain(doc)["matched_tokens"] == 0, 15, "the reset to reach the index")


def test_cost_reads_what_a_replica_cached_for_another_sender(spawn: Processes,
                                                             tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "cost", "kv_event_grace_s": 0.5},
                        kv_events=True)
    target = fleet.replicas[1]
    rng = random.Random(11)
    doc = sample_text(rng, 300)
    with httpx.Client(timeout=30) as http, openai.OpenAI(
            base_url=f"{fleet.gateway}/v1", api_key="unused", max_retries=0) as client:

        def explain() -> dict[str, Any]:
            body = {"model": MODEL, "prompt": doc, "max_tokens": 4}
            return http.post(f"{fleet.admin}/admin/explain", json=body,
                             headers=fleet.admin_headers).json()

        def send() -> None:
            http.post(f"{target.url}/v1/completions",
                      json={"model": MODEL, "prompt": doc, "max_tokens": 1}).raise_for_status()

        # sent to the replica directly (as by another gateway copy, or a client that
        # bypasses this one): the cache model cannot know of it, the replica's events tell
        send()
        decision = wait_until(lambda: (d := explain())["matched_tokens"] > 0 and d, 15,
                              f"{target.id} to report the document's blocks", retry=send)
        assert decision["policy"] == "cost" and decision["chosen"] == target.id
        assert decision["reason"] == "cache_match" and decision["matched_tokens"] >= 400
        assert target.id in decision["policy_state"]["kv_event_replicas"]

        answer = client.completions.with_raw_response.create(model=MODEL, prompt=doc,
                                                              max_tokens=4)
        assert answer.headers["x-kvgate-replica"] == target.id
        assert answer.headers["x-kvgate-route"] == "cache_match"
        usage = answer.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == decision["matched_tokens"]

        # the replica drops its cache: once the prompt's grace is over, it is predicted cold
        http.post(f"{target.url}/reset_prefix_cache").raise_for_status()
        wait_until(lambda: explain()["matched_tokens"] == 0, 15,
                   "the reset to reach the index")
