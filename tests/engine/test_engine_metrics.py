"""The engine's /metrics as a Prometheus scrape of vLLM shows them: labels, the series that
exist before any request, the per-request and per-step histograms after a scripted run,
and the gateway's scraper reading it all back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from engine.metrics import EngineMetrics, buckets_1_2_5
from engine.request import SamplingParams
from gateway.replica_metrics import parse_metrics
from kvwire import metric_names as m
from tests.support.engine_cores import make_core
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.metrics import Samples, samples
from tests.support.waiting import wait_until

MODEL = "tiny-sim"
LABELS = {"model_name": MODEL, "engine": "0"}
HISTOGRAMS = (m.TTFT, m.E2E_LATENCY, m.QUEUE_TIME, m.INTER_TOKEN_LATENCY,
              m.REQUEST_PROMPT_TOKENS, m.REQUEST_GENERATION_TOKENS, m.REQUEST_PREFILL_TIME,
              m.REQUEST_DECODE_TIME, m.REQUEST_INFERENCE_TIME, m.ITERATION_TOKENS)


class Engine(LiveEngine):
    def text(self) -> str:
        return self.http.get("/metrics").text

    def samples(self) -> Samples:
        return samples(self.text())

    def value(self, name: str, **labels: str) -> float:
        return self.samples()[(name, tuple(sorted({**LABELS, **labels}.items())))]


@pytest.fixture
def engine() -> Iterator[Engine]:
    yield from serve_engine(Engine, MODEL)


def test_every_series_exists_at_start_up_with_vllm_labels(engine: Engine) -> None:
    samples = engine.samples()
    key = tuple(sorted(LABELS.items()))
    for name in HISTOGRAMS:
        assert samples[(name + "_count", key)] == 0, name
        assert samples[(name + "_sum", key)] == 0, name
    for reason in m.FINISHED_REASONS:
        labels = tuple(sorted({**LABELS, "finished_reason": reason}.items()))
        assert samples[(m.REQUEST_SUCCESS + "_total", labels)] == 0
    for name in (m.NUM_REQUESTS_RUNNING, m.NUM_REQUESTS_WAITING, m.KV_CACHE_USAGE,
                 m.PROMPT_TOKENS_WAITING, m.PREFIX_CACHE_HITS + "_total",
                 m.PREFIX_CACHE_QUERIES + "_total", m.GENERATION_TOKENS + "_total"):
        assert samples[(name, key)] == 0, name
    names = {name for name, _ in samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes",
            "process_open_fds"} <= names
    text = engine.text()
    # the queue-time histogram resolves waits well under vLLM's lowest bucket (0.3 s)
    assert f'{m.QUEUE_TIME}_bucket{{engine="0",le="0.001",model_name="{MODEL}"}} 0.0' in text
    assert f'{m.REQUEST_PROMPT_TOKENS}_bucket{{engine="0",le="500.0",' in text
    assert 'vllm:cache_config_info{block_size="4",engine="0",num_gpu_blocks="256"} 1.0' in text


def test_buckets_1_2_5() -> None:
    assert buckets_1_2_5(512) == (1, 2, 5, 10, 20, 50, 100, 200, 500)
    assert buckets_1_2_5(1) == (1,)


def test_histograms_after_a_scripted_run(engine: Engine) -> None:
    prompt = [300 + i for i in range(20)]
    outs = [engine.client.completions.create(model=MODEL, prompt=prompt, max_tokens=3),
            engine.client.completions.create(model=MODEL, prompt=[*prompt, 7, 8],
                                             max_tokens=5)]
    whole = engine.client.completions.create(model=MODEL, prompt="a stop string test",
                                             max_tokens=12, extra_body={"ignore_eos": True})
    text = whole.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    stopped = engine.client.completions.create(model=MODEL, prompt="a stop string test",
                                               max_tokens=12, stop=[stop],
                                               extra_body={"ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop"
    with engine.http.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": "left early", "max_tokens": 400, "stream": True,
            "ignore_eos": True}) as r:
        next(r.iter_lines())  # the client leaves after the first token
    wait_until(lambda: engine.value(m.REQUEST_SUCCESS + "_total", finished_reason="abort")
               == 1, 10, "the abort to be counted")

    assert engine.value(m.REQUEST_SUCCESS + "_total", finished_reason="length") == 3
    assert engine.value(m.REQUEST_SUCCESS + "_total", finished_reason="stop") == 1
    finished = [*outs, whole]
    assert engine.value(m.REQUEST_PROMPT_TOKENS + "_count") == 4
    prompt_sum = sum(o.usage.prompt_tokens for o in [*finished, stopped])
    assert engine.value(m.REQUEST_PROMPT_TOKENS + "_sum") == prompt_sum
    assert engine.value(m.REQUEST_GENERATION_TOKENS + "_sum") >= sum(
        o.usage.completion_tokens for o in finished)
    for name in (m.E2E_LATENCY, m.REQUEST_PREFILL_TIME, m.REQUEST_DECODE_TIME,
                 m.REQUEST_INFERENCE_TIME):
        assert engine.value(name + "_count") == 4, name
    assert engine.value(m.TTFT + "_count") == 5  # the aborted one had its first token
    assert engine.value(m.QUEUE_TIME + "_count") == 5
    # running = prefill + decode, per request, so in sum too; e2e adds the queue
    inference = engine.value(m.REQUEST_INFERENCE_TIME + "_sum")
    assert inference == pytest.approx(engine.value(m.REQUEST_PREFILL_TIME + "_sum")
                                      + engine.value(m.REQUEST_DECODE_TIME + "_sum"), rel=1e-6)
    assert engine.value(m.E2E_LATENCY + "_sum") >= inference > 0
    # one inter-token gap per token after the first (the aborted request's too)
    gaps = engine.value(m.INTER_TOKEN_LATENCY + "_count")
    assert gaps >= sum(o.usage.completion_tokens - 1 for o in finished)
    assert engine.value(m.INTER_TOKEN_LATENCY + "_sum") > 0
    # one observation per engine step, of the tokens it computed
    stats = engine.server.core.stats
    wait_until(lambda: engine.value(m.ITERATION_TOKENS + "_count") == stats.num_steps, 10,
               "every step to be observed")
    assert engine.value(m.ITERATION_TOKENS + "_sum") == stats.num_batched_tokens


def test_gateway_scraper_reads_the_engine_exposition(engine: Engine) -> None:
    engine.client.completions.create(model=MODEL, prompt=[300 + i for i in range(20)],
                                     max_tokens=2)
    engine.client.completions.create(model=MODEL, prompt=[300 + i for i in range(20)],
                                     max_tokens=2)
    text = engine.text()
    one = parse_metrics(text)
    assert one.dialect == "vllm"
    assert one.kv_capacity_tokens == 4 * 256
    assert one.query_tokens == engine.value(m.PREFIX_CACHE_QUERIES + "_total") == 40
    assert one.hit_tokens == engine.value(m.PREFIX_CACHE_HITS + "_total") == 16
    assert one.queued_tokens == 0 and one.running == 0
    # the same engine twice, as vLLM with two data-parallel ranks shows it
    rank1 = "\n".join(line.replace('engine="0"', 'engine="1"') for line in text.splitlines()
                      if 'engine="0"' in line)
    two = parse_metrics(text + rank1 + "\n")
    assert two.query_tokens == 80 and two.hit_tokens == 32
    assert two.kv_capacity_tokens == 2 * 4 * 256
    assert two.kv_usage == one.kv_usage  # a ratio: averaged, never summed


def test_an_engine_without_cache_config_info_tells_usage_but_no_capacity() -> None:
    core = make_core(num_blocks=64, block_size=4, vocab=(259, 4096), max_model_len=128)
    metrics = EngineMetrics(core, MODEL, cache_config_info=False)
    text = generate_latest(metrics.registry).decode()
    assert m.CACHE_CONFIG_INFO not in text
    assert m.KV_CACHE_USAGE in text
    scraped = parse_metrics(text)
    assert scraped.dialect == "vllm" and scraped.kv_capacity_tokens is None
    shown = parse_metrics(generate_latest(EngineMetrics(core, MODEL).registry).decode())
    assert shown.kv_capacity_tokens == 4 * 64


def test_a_request_ended_early_as_its_last_step_ran_is_counted_once() -> None:
    # the client left and the server counted an abort, while the step that finished the
    # request was running (the abort reaches the engine only after it)
    core = make_core(num_blocks=16, block_size=4)
    metrics = EngineMetrics(core, MODEL)
    core.add_request(core.make_request("r1", [1, 2, 3, 4, 5],
                                       SamplingParams(max_tokens=1, ignore_eos=True)))
    metrics.started("r1")
    metrics.ended_early("r1", "abort", None, 0.0)
    out = core.step(0.0)
    assert [o.finish_reason for o in out.outputs] == ["length"]
    metrics.observe_step(out, out.seconds)
    got = samples(generate_latest(metrics.registry).decode())
    counted = {dict(labels)["finished_reason"]: value for (name, labels), value in got.items()
               if name == m.REQUEST_SUCCESS + "_total" and value}
    assert counted == {"abort": 1.0}
