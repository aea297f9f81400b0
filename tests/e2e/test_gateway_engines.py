"""The official OpenAI client -> the gateway -> real engine processes (sim executor)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from gateway.replica_metrics import parse_metrics
from kvwire.tokenizer_build import sample_text
from tests.support.fleets import start_fleet
from tests.support.processes import Processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def engine_hits(url: str) -> tuple[float, float]:
    m = parse_metrics(httpx.get(f"{url}/metrics").text)
    assert m.hit_tokens is not None and m.query_tokens is not None
    return m.hit_tokens, m.query_tokens


def test_prefix_affinity_sends_each_document_home(spawn: Processes, tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "prefix_affinity", "prefix_tokens": 128})
    gateway, urls = fleet.gateway, fleet.urls
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["sim-llama"]
    rng = random.Random(3)
    docs = [sample_text(rng, 300) for _ in range(4)]
    homes: dict[int, set[str]] = {i: set() for i in range(len(docs))}
    cached_later = []
    prompt_total = cached_total = 0
    for turn in range(3):
        for i, doc in enumerate(docs):
            raw = client.completions.with_raw_response.create(
                model="sim-llama", prompt=f"{doc}\nQuestion {turn}: what is clause {turn}?",
                max_tokens=4)
            homes[i].add(raw.headers["x-kvgate-replica"])
            assert raw.headers["x-kvgate-route"] in ("affinity", "spill")
            done = raw.parse()
            assert done.usage is not None and done.usage.completion_tokens == 4
            details = done.usage.prompt_tokens_details
            prompt_total += done.usage.prompt_tokens
            cached_total += details.cached_tokens if details else 0
            if turn:
                cached_later.append(details.cached_tokens if details else 0)
    assert all(len(h) == 1 for h in homes.values()), homes
    assert len(set().union(*homes.values())) == 2  # both replicas own documents
    # every repeated document hits: at least its ~500 document tokens, whole blocks
    assert min(cached_later) >= 400, cached_later
    hits = sum(engine_hits(u)[0] for u in urls)
    assert hits == sum(cached_later)

    chunks = list(client.chat.completions.create(
        model="sim-llama", messages=[{"role": "user", "content": docs[0]}], stream=True,
        max_tokens=5, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 5
    prompt_total += usage.prompt_tokens
    cached_total += usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details \
        else 0

    # SGLang's native /generate, routed by its prompt as a completion is: the same ids go
    # to one replica, where their second run hits the cache; its meta_info is its usage
    ids = httpx.post(f"{gateway}/tokenize", json={"model": "sim-llama",
                                                  "prompt": docs[1]}).json()["tokens"]
    runs = [httpx.post(f"{gateway}/generate", json={
        "input_ids": ids, "rid": f"gen-{i}", "sampling_params": {"max_new_tokens": 3}})
        for i in range(2)]
    assert [r.status_code for r in runs] == [200, 200], runs[0].text
    assert len({r.headers["x-kvgate-replica"] for r in runs}) == 1
    assert runs[1].headers["x-request-id"] == "gen-1"  # rid names the request
    metas = [r.json()["meta_info"] for r in runs]
    assert metas[1]["cached_tokens"] >= 400 and metas[1]["completion_tokens"] == 3
    with httpx.stream("POST", f"{gateway}/generate", json={
            "text": docs[2], "stream": True, "sampling_params": {"max_new_tokens": 4}}) as r:
        assert r.headers["x-kvgate-replica"] in homes[2]  # the document's home
        events = [e for e in r.read().split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    metas.append(json.loads(events[-2].removeprefix(b"data: "))["meta_info"])
    assert metas[-1]["completion_tokens"] == 4 and metas[-1]["cached_tokens"] >= 400
    prompt_total += sum(m["prompt_tokens"] for m in metas)
    cached_total += sum(m["cached_tokens"] for m in metas)

    def samples(name: str) -> list[float]:
        return [float(line.split()[-1]) for line in httpx.get(f"{gateway}/metrics").text
                .splitlines() if line.startswith(name) and not line.startswith("#")]

    # the gateway read every answer's usage, a streamed one from its last event
    assert sum(samples("kvgate_prompt_tokens_total")) == prompt_total
    assert sum(samples("kvgate_cached_prompt_tokens_total")) == cached_total
    # the fleet hit rate needs two scrapes with traffic
    (rate,) = wait_until(lambda: samples("kvgate_fleet_token_hit_rate "), 10,
                         "the fleet hit rate")
    assert 0 < rate <= 1


def test_dead_replica_is_retried_and_ejected(spawn: Processes, tmp_path: Path) -> None:
    fleet = start_fleet(spawn, tmp_path, {"name": "round_robin"})
    gateway = fleet.gateway
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
    fleet.replicas[0].proc.terminate()
    fleet.replicas[0].proc.wait(timeout=10)
    for i in range(4):
        done = client.completions.create(model="sim-llama", prompt=f"hello {i}", max_tokens=2)
        assert done.choices[0].text
    replicas = httpx.get(f"{fleet.admin}/admin/replicas",
                         headers=fleet.admin_headers).json()["replicas"]
    assert [r["healthy"] for r in replicas] == [False, True]
    bad = httpx.post(f"{gateway}/v1/completions",
                     json={"model": "sim-llama", "prompt": "x", "max_tokens": -3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"


def test_torch_replicas_behind_the_gateway(spawn: Processes, tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    made = subprocess.run([sys.executable, "-m", "kvgate", "make-tiny-model", str(model),
                           "--arch", "qwen2"], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    fleet = start_fleet(
        spawn, tmp_path, {"name": "prefix_affinity", "prefix_tokens": 32},
        engine=("--executor", "torch", "--model", str(model), "--kv-cache-gib", "0.05",
                "--model-name", "tiny"),
        tokenizer=str(model))
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key="x", max_retries=0)
    doc = sample_text(random.Random(9), 60)
    first = client.completions.with_raw_response.create(
        model="tiny", prompt=doc + " first question", max_tokens=3)
    second = client.completions.with_raw_response.create(
        model="tiny", prompt=doc + " second question", max_tokens=3)
    assert first.headers["x-kvgate-replica"] == second.headers["x-kvgate-replica"]
    usage = second.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens >= 64
    home = fleet.replica(first.headers["x-kvgate-replica"]).url
    assert engine_hits(home)[0] == usage.prompt_tokens_details.cached_tokens
