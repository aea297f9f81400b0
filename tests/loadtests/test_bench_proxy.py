import argparse
import asyncio
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtests.bench_proxy import (
    _floor_cpu,
    _median_run,
    _prefix_tokenize_ms,
    _start_gateway,
    _stop,
    _throughput_rounds,
    _wait,
    median_table,
    policy_spec,
    ratios_by_round,
    uvicorn_app,
)
from loadtests.gateway_cpu import bodies, documents, offered_load, scenario_bodies, warm_up
from tests.support.metrics import samples

ENV = dict(os.environ, PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    """The benchmark's fake backend in its own process: its base URL. One for the module:
    it keeps nothing between requests (a fixed answer to every one)."""
    proc, base = uvicorn_app("loadtests.bench_proxy:backend_app", ENV)
    try:
        _wait(f"{base}/health", proc)
        yield base
    finally:
        _stop(proc)


def test_the_prefix_tokenizing_cost_is_timed_back_to_back_and_spaced() -> None:
    out = _prefix_tokenize_ms(documents(4, words=1500))
    assert set(out) == {"back_to_back", "spaced_10ms"}
    assert all(v > 0 for v in out.values())


@pytest.mark.slow
def test_the_floor_proxy_relays_the_backend_answer_unchanged_and_is_measured(backend: str
                                                                             ) -> None:
    """The minimal pass-throughs answer what the backend answers, byte for byte, streamed
    or not, and ``_floor_cpu`` measures the streaming ones' CPU per request for each kind."""
    prompts = documents(2, words=50)
    for app in ("aiohttp_stream_app", "kvgate_stream_app", "kvgate_app"):
        proxy, proxied = uvicorn_app(f"loadtests.proxy_clients:{app}",
                                     dict(ENV, BENCH_BACKEND=backend))
        try:
            _wait(f"{proxied}/health", proxy)
            for stream in (True, False):
                body = bodies(prompts, stream)[0]

                def answer(url: str, body: bytes = body) -> bytes:
                    req = urllib.request.Request(url + "/v1/completions", data=body)
                    with urllib.request.urlopen(req, timeout=10) as r:
                        return r.read()
                direct = answer(backend)
                assert direct == answer(proxied), app
                assert (b"data: [DONE]" in direct) == stream
        finally:
            _stop(proxy)
    args = argparse.Namespace(rate=50.0, cpu_seconds=0.1)
    out = _floor_cpu(backend, ENV, prompts, args)
    assert set(out) == {"kvgate_client_stream_proxy", "aiohttp_stream_proxy"}
    assert all(set(kinds) == {"stream_repeated", "stream_fresh", "plain_repeated"}
               for kinds in out.values())


def _built(base: str) -> tuple[float, float]:
    """(routing requests built, of them on the tokenizer pool) from a gateway's /metrics
    (summed over workers)."""
    got = samples(httpx.get(f"{base}/metrics", timeout=10).text)
    where = {dict(labels)["where"]: value for (name, labels), value in got.items()
             if name == "kvgate_prompts_built_total"}
    return where.get("pool", 0.0) + where.get("inline", 0.0), where.get("pool", 0.0)


@pytest.mark.slow
def test_with_workers_the_warm_up_leaves_no_document_unencoded_in_any_worker(
        tmp_path: Path, backend: str) -> None:
    """Each worker keeps its own tokenizer memo and a connection stays with one worker:
    after ``warm_up`` for two workers, a measured run of repeated documents encodes none
    (every request is built inline, from a remembered document, none on the tokenizer
    pool), so the CPU per request measured is the steady state's. prefix_affinity keyed on
    token ids: its default keys on text pieces and encodes nothing."""
    gateway, url = _start_gateway(str(tmp_path), "prefix_affinity:chunk_chars=0", backend, 2,
                                  ENV)
    try:
        prompts = documents(16)
        warm_up(f"{url}/v1/completions", "stream_repeated", prompts, 100.0, workers=2)
        total0, pooled0 = _built(url)
        assert pooled0 >= len(prompts)  # the warm-up did encode every document
        stream = scenario_bodies("stream_repeated", prompts, 0)
        measured = [next(stream) for _ in range(160)]
        assert asyncio.run(offered_load(f"{url}/v1/completions", measured, 100.0)) == 160
        total1, pooled1 = _built(url)
        assert total1 - total0 == 160
        assert pooled1 == pooled0
    finally:
        _stop(gateway)


def test_a_policy_spec_sets_the_policys_settings() -> None:
    assert policy_spec("cost") == {"name": "cost"}
    assert policy_spec("prefix_affinity:chunk_chars=0:overload=1.5") == {
        "name": "prefix_affinity", "chunk_chars": 0, "overload": 1.5}
    with pytest.raises(ValueError, match="'chunk_chars' of 'prefix_affinity:chunk_chars'"):
        policy_spec("prefix_affinity:chunk_chars")


def test_a_ratio_is_taken_within_a_round_and_the_median_kept() -> None:
    # the machine ran twice as fast in round 1: within each round the gateway gets half
    # of direct, which a ratio of the medians (2,500 / 8,000) would not say
    rps = {"direct": [4000.0, 8000.0, 9000.0], "gateway": [2000.0, 4000.0, 2500.0]}
    assert ratios_by_round(rps, ("gateway",)) == {"gateway": 0.5}
    with pytest.raises(ValueError):
        ratios_by_round({"direct": [1.0, 2.0], "gateway": [1.0]}, ("gateway",))
    runs = [{"rps": 3.0, "p50_ms": 1.0}, {"rps": 1.0, "p50_ms": 3.0},
            {"rps": 2.0, "p50_ms": 2.0}]
    assert _median_run(runs) == {"rps": 2.0, "p50_ms": 2.0}
    assert _median_run(runs[:2]) == {"rps": 1.0, "p50_ms": 3.0}


def test_cpu_figures_are_the_median_of_their_rounds() -> None:
    rounds = [{"p": {"stream": 2.0, "plain": 1.0}}, {"p": {"stream": 1.0, "plain": 3.0}},
              {"p": {"stream": 1.5, "plain": 2.0}}]
    assert median_table(rounds) == {"p": {"stream": 1.5, "plain": 2.0}}
    with pytest.raises(ValueError, match="no rounds"):
        median_table([])


def test_every_target_is_measured_every_round(backend: str) -> None:
    bodies_ = bodies(documents(2, words=50), False)
    args = argparse.Namespace(rounds=2, seconds=0.05)
    rounds = _throughput_rounds({"direct": backend, "again": backend}, bodies_, args)
    assert len(rounds) == 2
    for measured in rounds:
        assert set(measured) == {"direct", "again"}
        for name in measured:
            assert measured[name]["c1"]["rps"] > 0 and measured[name]["c32"]["rps"] > 0
    # the second round runs the targets in the other order
    assert list(rounds[0]) == ["direct", "again"] and list(rounds[1]) == ["again", "direct"]


def test_the_backends_answers_are_whole_through_the_gateway(tmp_path: Path, backend: str
                                                            ) -> None:
    """The CPU figures are those of answers the gateway relays as whole: the backend's
    stream ends as vLLM's does (a finish reason on its last token's event, then usage and
    [DONE]), so no measured request takes the path of a cut answer."""
    gateway, url = _start_gateway(str(tmp_path), "prefix_affinity", backend, 1, ENV)
    try:
        prompts = documents(2, words=200)
        for scenario in ("stream_repeated", "plain_repeated"):
            payloads = scenario_bodies(scenario, prompts, 0)
            sent = [next(payloads) for _ in range(4)]
            assert asyncio.run(offered_load(f"{url}/v1/completions", sent, 50.0)) == 4
        got = samples(httpx.get(f"{url}/metrics", timeout=10).text)
        statuses: dict[str, float] = {}
        for (name, labels), value in got.items():
            if name == "kvgate_requests_total" and value:
                status = dict(labels)["status"]
                statuses[status] = statuses.get(status, 0.0) + value
        assert statuses == {"200": 8.0}, statuses
    finally:
        _stop(gateway)
