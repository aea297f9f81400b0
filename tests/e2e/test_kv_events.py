"""``kv_events`` end to end: two sim engines publishing KV events over ZMQ, the gateway
subscribed to both, the official OpenAI client in front."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from kvwire.tokenizer_build import sample_text
from tests.conftest import free_port, wait_http
from tests.e2e.test_gateway_engines import Spawn

pytestmark = pytest.mark.slow
MODEL = "sim-llama"


def wait_for(what: str, check: Callable[[], Any], retry: Callable[[], object] | None = None,
             timeout: float = 15.0) -> Any:
    """Poll ``check`` until it returns something truthy; ``retry`` runs every second."""
    deadline = time.monotonic() + timeout
    last_retry = time.monotonic()
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if retry is not None and time.monotonic() - last_retry > 1.0:
            retry()
            last_retry = time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_repeated_document_goes_where_its_blocks_are(spawn: Spawn, tmp_path: Path) -> None:
    urls, endpoints, procs = [], [], []
    for _ in range(2):
        port, zport = free_port(), free_port()
        endpoint = f"tcp://127.0.0.1:{zport}"
        procs.append(spawn("engine", "--executor", "sim", "--port", str(port),
                           "--kv-cache-gib", "1", "--model-name", MODEL,
                           "--kv-events-endpoint", endpoint))
        urls.append(f"http://127.0.0.1:{port}")
        endpoints.append(endpoint)
    for url, proc in zip(urls, procs, strict=True):
        wait_http(f"{url}/health", 60, proc)
    gport = free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": gport, "policy": {"name": "kv_events"},
        "replicas": [{"id": f"r{i}", "url": u, "kv_events": e}
                     for i, (u, e) in enumerate(zip(urls, endpoints, strict=True))],
        "health": {"interval_s": 0.3, "timeout_s": 1},
        "scrape": {"interval_s": 0.3},
    }))
    gateway = f"http://127.0.0.1:{gport}"
    spawn("serve", "--config", str(config), ready_url=f"{gateway}/ready")
    with httpx.Client(timeout=30) as http, openai.OpenAI(
            base_url=f"{gateway}/v1", api_key="unused", max_retries=0) as client:
        check_routing(http, client, gateway, urls)


def check_routing(http: httpx.Client, client: openai.OpenAI, gateway: str,
                  urls: list[str]) -> None:

    def explain(prompt: str) -> dict[str, Any]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
        return http.post(f"{gateway}/admin/explain", json=body).json()

    def matched(prompt: str, replica: str) -> int:
        return next(s["matched_tokens"] for s in explain(prompt)["scores"]
                    if s["replica"] == replica)

    rng = random.Random(7)
    # Each replica caches a warm-up text sent to it directly, until the gateway sees it:
    # a subscriber only receives what is published after it has joined.
    for i, url in enumerate(urls):
        warm = sample_text(rng, 120)

        def send(url: str = url, warm: str = warm) -> None:
            http.post(f"{url}/v1/completions",
                      json={"model": MODEL, "prompt": warm, "max_tokens": 1}).raise_for_status()

        send()
        wait_for(f"r{i} to report its blocks", lambda i=i, warm=warm: matched(warm, f"r{i}"),
                 retry=send)

    doc = sample_text(rng, 300)
    first = client.completions.with_raw_response.create(model=MODEL, prompt=doc, max_tokens=4)
    home = first.headers["x-kvgate-replica"]
    decision = wait_for("the document's blocks to be indexed",
                        lambda: (d := explain(doc))["matched_tokens"] > 0 and d)
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
    http.post(f"{urls[int(home[1:])]}/reset_prefix_cache").raise_for_status()
    wait_for("the reset to reach the index", lambda: explain(doc)["matched_tokens"] == 0)
