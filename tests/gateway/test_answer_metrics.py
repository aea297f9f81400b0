"""The gateway's histograms of answers by model and route reason (TTFT at the gateway,
duration, output tokens), against a scripted replica whose timing and token counts are
known, and the bound on the ``model`` label."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from engine.server import EngineServer, build_app
from gateway.answer_metrics import (
    DURATION,
    MAX_MODEL_LABELS,
    OTHER_MODEL,
    OUTPUT_TOKENS,
    TTFT,
    AnswerMetrics,
)
from gateway.app import create_app
from gateway.config import parse_config
from gateway.state import build_state
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.metrics import Samples, samples
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]
MODEL = "sim-model"
REASON = "round_robin"


def _samples(url: str) -> Samples:
    return samples(httpx.get(f"{url}/metrics").text)


def _series(url: str, name: str, model: str = MODEL, reason: str = REASON) -> float:
    return _samples(url).get((name, (("model", model), ("reason", reason))), 0.0)


def _gateway(serve: Serve, behaviour: Behaviour) -> str:
    replica = serve(fake_replica(behaviour))
    config = parse_config({
        "replicas": [{"id": "a", "url": replica.url}], "policy": {"name": "round_robin"},
        "health": {"interval_s": 0.2, "timeout_s": 5.0}, "scrape": {"interval_s": 0.2}})
    state = build_state(config)
    url = serve(create_app(config, state)).url
    wait_until(lambda: state.fleet.models() == {MODEL}, 10, "the replica's model list")
    return url


def test_stream_ttft_duration_and_content_chunks(serve: Serve) -> None:
    b = Behaviour("a", first_byte_delay_s=0.2, chunk_delay_s=0.1, chunks=5)
    url = _gateway(serve, b)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model=MODEL, stream=True,
                                            messages=[{"role": "user", "content": "hi"}])
    assert [c.choices[0].delta.content for c in stream] == [f"t{i} " for i in range(5)]
    wait_until(lambda: _series(url, DURATION + "_count") == 1, 10, "the answer recorded")
    ttft = _series(url, TTFT + "_sum")
    duration = _series(url, DURATION + "_sum")
    assert 0.2 <= ttft < 0.2 + 0.1 * 4  # the first token, not the last
    assert duration >= 0.2 + 0.1 * 4 and duration > ttft
    # no usage asked for: the content chunks are counted
    assert _series(url, OUTPUT_TOKENS + "_count") == 1
    assert _series(url, OUTPUT_TOKENS + "_sum") == 5
    assert _samples(url)[(OUTPUT_TOKENS + "_bucket",
                          (("le", "5.0"), ("model", MODEL), ("reason", REASON)))] == 1


def test_non_streamed_answer_reports_usage_tokens(serve: Serve) -> None:
    b = Behaviour("a", first_byte_delay_s=0.15, chunks=7)
    url = _gateway(serve, b)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for _ in range(2):
        out = client.completions.create(model=MODEL, prompt="hello")
        assert out.usage is not None and out.usage.completion_tokens == 7
    assert _series(url, OUTPUT_TOKENS + "_sum") == 14
    assert _series(url, TTFT + "_count") == 2 and _series(url, TTFT + "_sum") >= 0.3
    assert _series(url, DURATION + "_count") == 2


def test_failed_answers_are_not_recorded(serve: Serve) -> None:
    b = Behaviour("a", status=400)
    url = _gateway(serve, b)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hello")
    samples = _samples(url)
    assert samples[("kvgate_requests_total",
                    (("replica", "a"), ("route", REASON), ("status", "400")))] == 1
    assert _series(url, DURATION + "_count") == 0


def test_model_label_is_bounded_to_the_fleet_models() -> None:
    registry = CollectorRegistry()
    answers = AnswerMetrics(registry, {"llama"}.__contains__, ("affinity", "spill"))
    answers.answered("llama", "affinity", 0.1, 0.5, 3)
    for i in range(50):
        answers.answered(f"made-up-{i}", "affinity", 0.1, 0.5, 3)
    answers.answered(None, "spill", None, 0.5, None)
    models = {s.labels["model"] for fam in registry.collect() for s in fam.samples
              if s.name == DURATION + "_count"}
    assert models == {"llama", OTHER_MODEL}
    assert registry.get_sample_value(DURATION + "_count",
                                     {"model": OTHER_MODEL, "reason": "affinity"}) == 50
    assert registry.get_sample_value(TTFT + "_count",
                                     {"model": OTHER_MODEL, "reason": "spill"}) == 0
    assert registry.get_sample_value(DURATION + "_count",
                                     {"model": OTHER_MODEL, "reason": "spill"}) == 1


def test_output_tokens_of_engine_streams(serve: Serve) -> None:
    """Against kvgate's engine (a chat stream opens with a role-only chunk): without usage
    the count is the content chunks the client got; with usage, the engine's own count."""
    core = make_core(num_blocks=256, block_size=4, vocab=(259, 4096), max_model_len=512)
    engine = EngineServer(core, load_tokenizer(None), model_name="tiny-sim",
                          sleep_modeled_time=True)
    replica = serve(build_app(engine))
    config = parse_config({"replicas": [{"id": "e", "url": replica.url}],
                           "policy": {"name": "round_robin"},
                           "health": {"interval_s": 0.2}, "scrape": {"interval_s": 0.2}})
    state = build_state(config)
    url = serve(create_app(config, state)).url
    wait_until(lambda: state.fleet.models() == {"tiny-sim"}, 10, "the engine's model list")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "count the chunks"}]
    chunks = list(client.chat.completions.create(
        model="tiny-sim", messages=messages, max_tokens=6, stream=True,
        extra_body={"ignore_eos": True}))
    content = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert 0 < content <= 6
    wait_until(lambda: _series(url, OUTPUT_TOKENS + "_count", "tiny-sim") == 1, 10,
               "the stream recorded")
    assert _series(url, OUTPUT_TOKENS + "_sum", "tiny-sim") == content
    usage = list(client.chat.completions.create(
        model="tiny-sim", messages=messages, max_tokens=6, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))[-1].usage
    assert usage is not None and usage.completion_tokens == 6
    wait_until(lambda: _series(url, OUTPUT_TOKENS + "_count", "tiny-sim") == 2, 10,
               "the second stream recorded")
    assert _series(url, OUTPUT_TOKENS + "_sum", "tiny-sim") == content + 6


def test_a_stream_the_client_closes_after_done_is_a_whole_answer(serve: Serve) -> None:
    """A client that hangs up once it has ``[DONE]``, before the replica ends its body,
    got the whole answer: it is recorded as answered, not as a disconnect."""
    b = Behaviour("a", chunks=3, linger_s=5.0)
    url = _gateway(serve, b)
    body = {"model": MODEL, "prompt": "hi", "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=10) as response:
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if line == "data: [DONE]":
                break
    assert lines[-1] == "data: [DONE]"
    wait_until(lambda: _series(url, DURATION + "_count") == 1, 4, "the answer recorded")
    assert _series(url, OUTPUT_TOKENS + "_sum") == 3


def test_model_labels_are_capped_and_given_back_by_models_that_left() -> None:
    """A fleet serving many LoRA adapters: the first MAX_MODEL_LABELS answered get a label,
    the rest are ``other``; one that leaves the fleet gives its place, its series gone."""
    registry = CollectorRegistry()
    served = {f"lora-{i}" for i in range(MAX_MODEL_LABELS + 20)}
    answers = AnswerMetrics(registry, lambda m: m in served, ("affinity",))
    for i in range(MAX_MODEL_LABELS + 20):
        answers.answered(f"lora-{i}", "affinity", 0.1, 0.5, 3)

    def labelled() -> set[str]:
        return {s.labels["model"] for fam in registry.collect() for s in fam.samples
                if s.name == DURATION + "_count"}

    assert labelled() == {f"lora-{i}" for i in range(MAX_MODEL_LABELS)} | {OTHER_MODEL}
    assert registry.get_sample_value(DURATION + "_count",
                                     {"model": OTHER_MODEL, "reason": "affinity"}) == 20
    served.discard("lora-0")  # unloaded: the next new model takes its place
    answers.answered(f"lora-{MAX_MODEL_LABELS}", "spill", 0.1, 0.5, 3)
    assert "lora-0" not in labelled() and f"lora-{MAX_MODEL_LABELS}" in labelled()
    assert len(labelled()) == MAX_MODEL_LABELS + 1
    answers.answered("lora-1", "spill", 0.1, 0.5, 3)  # a labelled model's new reason
    assert registry.get_sample_value(DURATION + "_count",
                                     {"model": "lora-1", "reason": "spill"}) == 1


def test_no_model_label_is_given_back_where_series_cannot_be_removed() -> None:
    """Worker processes (multiprocess mode cannot remove a series): each labels its first
    MAX_MODEL_LABELS models for good, the rest ``other``."""
    registry = CollectorRegistry()
    served = {f"m{i}" for i in range(MAX_MODEL_LABELS + 1)}
    answers = AnswerMetrics(registry, lambda m: m in served, ("affinity",), evict=False)
    for i in range(MAX_MODEL_LABELS):
        answers.answered(f"m{i}", "affinity", 0.1, 0.5, 3)
    served.discard("m0")
    answers.answered(f"m{MAX_MODEL_LABELS}", "affinity", 0.1, 0.5, 3)
    assert registry.get_sample_value(DURATION + "_count",
                                     {"model": "m0", "reason": "affinity"}) == 1
    assert registry.get_sample_value(DURATION + "_count",
                                     {"model": OTHER_MODEL, "reason": "affinity"}) == 1
