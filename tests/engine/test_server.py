"""The engine server against the official ``openai`` client and raw HTTP, on a real
uvicorn server on a free loopback port (sim executor with a tiny cost model)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.sim_executor import sim_token
from tests.support.engine_cores import make_core
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.waiting import wait_until

MODEL = "tiny-sim"


class Running(LiveEngine):
    def metrics(self) -> dict[str, float]:
        text = self.http.get("/metrics").text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if not s.name.endswith(("_bucket", "_created")):
                    out[s.name] = s.value
        return out


def _serve(**core_kw: object) -> Iterator[Running]:
    yield from serve_engine(Running, MODEL, **core_kw)


@pytest.fixture(scope="module")
def live() -> Iterator[Running]:
    yield from _serve()


@pytest.fixture
def fresh() -> Iterator[Running]:
    yield from _serve()


LONG = " ".join(f"clause {i} of the agreement binds the parties." for i in range(40))


def test_completion_usage_reports_cached_tokens(live: Running) -> None:
    first = live.client.completions.create(model=MODEL, prompt=LONG, max_tokens=4)
    assert first.usage is not None and first.usage.completion_tokens == 4
    assert first.choices[0].finish_reason == "length"
    again = live.client.completions.create(model=MODEL, prompt=LONG, max_tokens=4)
    n = again.usage.prompt_tokens
    assert n == first.usage.prompt_tokens > 100
    assert again.usage.prompt_tokens_details.cached_tokens == (n - 1) // 4 * 4
    assert again.choices[0].text == first.choices[0].text  # deterministic sim output


def test_token_id_prompt_and_models(live: Running) -> None:
    out = live.client.completions.create(model=MODEL, prompt=[300, 301, 302], max_tokens=2)
    assert out.usage.prompt_tokens == 3
    models = live.client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert live.http.get("/health").status_code == 200


def test_chat_stream_with_usage(live: Running) -> None:
    stream = live.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=5,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    full = live.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=5)
    assert full.choices[0].message.content == text
    n_prompt = live.http.post("/tokenize", json={
        "messages": [{"role": "user", "content": "hello there"}]}).json()["count"]
    assert full.usage.prompt_tokens == n_prompt


def test_raw_sse_framing(live: Running) -> None:
    with live.http.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": "abc", "max_tokens": 3, "stream": True}) as r:
        body = "".join(r.iter_text())
    assert r.headers["content-type"].startswith("text/event-stream")
    events = body.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: ") for e in events[:-1])


def test_stop_string_truncates(live: Running) -> None:
    base = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=12,
                                          seed=3).choices[0].text
    stop = base[6:9]
    cut = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=12,
                                         seed=3, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == base[: base.index(stop)]


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"prompt": "x", "max_tokens": 600}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "cache_salt": ""}, 400, "cache_salt"),
    ({"prompt": "x", "cache_salt": "s" * 129}, 400, "cache_salt"),
    ({"prompt": "x", "model": "nope"}, 404, "model"),
    ({"prompt": [1, 2, 99999]}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": "x", "suffix": "after"}, 400, "suffix"),
    ({"prompt": "x", "best_of": 3}, 400, "best_of"),
    ({"prompt": "x", "seed": 2**70}, 400, "seed"),
    ({"prompt": "x", "seed": -(2**64)}, 400, "seed"),
    ({"prompt": "x", "top_p": 2}, 400, "top_p"),
    ({"prompt": "x", "top_k": -5}, 400, "top_k"),
    ({"prompt": "x", "presence_penalty": 5}, 400, "presence_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"prompt": "x", "max_tokens": 3, "min_tokens": 10}, 400, "min_tokens"),
    ({"prompt": "x", "logit_bias": {"99999": 5}}, 400, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"7": 500}}, 400, "logit_bias"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "x", "guided_json": {"type": "object"}}, 400, "guided_json"),
])
def test_bad_input_gets_openai_errors(live: Running, body: dict, status: int,
                                      param: str) -> None:
    r = live.http.post("/v1/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ({"response_format": {"type": "bogus"}}, "response_format"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
])
def test_a_chat_asking_for_constrained_output_is_refused(live: Running, extra: dict,
                                                          param: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    r = live.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    plain = {**body, "response_format": {"type": "text"}, "tool_choice": "auto",
             "max_tokens": 2}
    assert live.http.post("/v1/chat/completions", json=plain).status_code == 200


def test_max_completion_tokens_wins_over_max_tokens(live: Running) -> None:
    chat = live.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=5,
        max_completion_tokens=2)
    assert chat.usage.completion_tokens == 2
    r = live.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 100_000})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_completion_tokens"


def test_stop_strings_and_tokens_as_vllm_reports_them(live: Running) -> None:
    base = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=12,
                                          seed=3).choices[0].text
    stop = base[6:9]
    kept = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=12,
                                          seed=3, stop=[stop],
                                          extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == base[: base.index(stop) + len(stop)]
    assert kept.choices[0].model_extra["stop_reason"] == stop
    # a stop token's text is left out; the token is named as what stopped it
    first3 = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=3,
                                            seed=3)
    executor = live.server.core.executor  # the sim's 4th token, drawn from the seed
    fourth = executor._lo + sim_token(3, first3.usage.prompt_tokens + 3, executor._span)
    cut = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=12,
                                         seed=3, extra_body={"stop_token_ids": [fourth]})
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens == 4
    assert cut.choices[0].text == first3.choices[0].text
    assert cut.choices[0].model_extra["stop_reason"] == fourth
    # kept in the text, the token is named all the same
    kept_id = live.client.completions.create(
        model=MODEL, prompt="stop test", max_tokens=12, seed=3,
        extra_body={"stop_token_ids": [fourth], "include_stop_str_in_output": True})
    assert kept_id.choices[0].finish_reason == "stop"
    assert kept_id.choices[0].model_extra["stop_reason"] == fourth
    assert kept_id.choices[0].text.startswith(first3.choices[0].text)
    plain = live.client.completions.create(model=MODEL, prompt="stop test", max_tokens=2)
    assert plain.choices[0].model_extra["stop_reason"] is None


def test_fields_asking_for_nothing_unsupported_pass(live: Running) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "logprobs": None, "echo": False,
            "best_of": 1}
    assert live.http.post("/v1/completions", json=body).status_code == 200


def test_malformed_json_and_client_errors(live: Running) -> None:
    r = live.http.post("/v1/completions", content=b'{"prompt": ')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        live.client.completions.create(model=MODEL, prompt=LONG * 3, max_tokens=10)
    with pytest.raises(openai.NotFoundError):
        live.client.completions.create(model="other", prompt="x")


def test_detokenize_names_an_id_outside_the_vocabulary(live: Running) -> None:
    for bad in (-1, 4096, 2**40):
        r = live.http.post("/detokenize", json={"tokens": [5, bad]})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "tokens" and str(bad) in r.text
    assert live.http.post("/detokenize", json={"tokens": [72, 105]}).status_code == 200


def test_a_chat_without_max_tokens_runs_where_the_cache_is_smaller_than_the_context(
) -> None:
    # 32 blocks of 4: 128 tokens of KV under a 512-token context
    for engine in serve_engine(Running, MODEL, num_blocks=32):
        answer = engine.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert answer.usage is not None
        assert answer.usage.prompt_tokens + answer.usage.completion_tokens <= 128


def test_salted_requests_do_not_share_cache(live: Running) -> None:
    prompt = "salt isolation " * 30
    for salt in ("tenant-a", "tenant-b"):
        out = live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                             extra_body={"cache_salt": salt})
        assert out.usage.prompt_tokens_details.cached_tokens == 0
    out = live.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                         extra_body={"cache_salt": "tenant-a"})
    assert out.usage.prompt_tokens_details.cached_tokens > 0


def test_metrics_match_a_scripted_run(fresh: Running) -> None:
    prompt = [300 + i for i in range(20)]
    fresh.client.completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    fresh.client.completions.create(model=MODEL, prompt=[*prompt, 400, 401], max_tokens=2)
    assert fresh.http.post("/reset_prefix_cache").status_code == 200
    fresh.client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    m = fresh.metrics()
    assert m["vllm:prompt_tokens_total"] == 20 + 22 + 20
    assert m["vllm:prefix_cache_queries_total"] == 62
    assert m["vllm:prefix_cache_hits_total"] == 20  # 2nd reuses 5 blocks; reset drops all
    assert m["vllm:generation_tokens_total"] == 6
    assert m["vllm:num_preemptions_total"] == 0
    assert m["vllm:time_to_first_token_seconds_count"] == 3
    assert m["vllm:e2e_request_latency_seconds_count"] == 3
    assert m["vllm:request_queue_time_seconds_count"] == 3
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["kvgate:num_prompt_tokens_waiting"] == 0
    assert m["vllm:kv_cache_usage_perc"] == 0
    text = fresh.http.get("/metrics").text
    assert 'vllm:cache_config_info{block_size="4",engine="0",num_gpu_blocks="256"} 1.0' \
        in text


def test_client_disconnect_aborts_the_request(fresh: Running) -> None:
    with fresh.http.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": "long story", "max_tokens": 400, "stream": True,
            "ignore_eos": True}) as r:
        first = next(r.iter_lines())
        assert first.startswith("data: ")
    core = fresh.server.core
    wait_until(lambda: core.stats.num_requests_aborted, 10, "the engine to abort the request")
    assert core.stats.num_requests_aborted == 1
    assert core.stats.generation_tokens < 400


def test_client_disconnect_aborts_a_non_streamed_request(fresh: Running) -> None:
    body = json.dumps({"model": MODEL, "prompt": "long story", "max_tokens": 400,
                       "ignore_eos": True}).encode()
    host, port = fresh.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        core = fresh.server.core
        wait_until(lambda: core.stats.generation_tokens, 10, "the engine to generate")
    wait_until(lambda: core.stats.num_requests_aborted, 10, "the engine to abort the request")
    assert core.stats.num_requests_aborted == 1
    assert core.stats.generation_tokens < 400


async def test_failing_admin_call_raises_and_the_engine_lives_on() -> None:
    from engine.async_engine import AsyncEngine

    engine = AsyncEngine(make_core(num_blocks=16, block_size=4), sleep_modeled_time=False)
    await engine.start()
    try:
        with pytest.raises(ZeroDivisionError):
            await engine.call(lambda core: 1 / 0)
        assert engine.alive
        assert await engine.call(lambda core: core.config.block_size) == 4
    finally:
        await engine.stop()


async def test_sim_steps_count_their_modeled_seconds_and_how_late_they_ended() -> None:
    """A step whose work outlasts its modeled time (a host too busy for its fleet) shows
    as lateness, in ``late_s`` and in /metrics' counters."""
    import time

    from prometheus_client import generate_latest

    from engine.async_engine import AsyncEngine
    from engine.metrics import EngineMetrics
    from engine.request import SamplingParams
    from kvwire import metric_names as m
    from tests.support.metrics import samples

    core = make_core(num_blocks=16, block_size=4)
    step = core.step
    slow_s = 0.03

    def slow_step(now: float):  # type: ignore[no-untyped-def]
        time.sleep(slow_s)  # the host, not the model: real seconds past the modeled ones
        return step(now)
    core.step = slow_step  # type: ignore[method-assign]
    engine = AsyncEngine(core, sleep_modeled_time=True)
    metrics = EngineMetrics(core, "tiny", pace=lambda: (engine.modeled_s, engine.late_s))
    await engine.start()
    try:
        queue = engine.add(core.make_request("r1", [1, 2, 3, 4, 5],
                                             SamplingParams(max_tokens=3, ignore_eos=True)))
        while not (await queue.get()).finished:  # type: ignore[union-attr]
            pass
    finally:
        await engine.stop()
    steps = 3  # a prefill step and two decode steps
    assert engine.modeled_s > 0
    assert engine.late_s >= steps * slow_s - engine.modeled_s
    got = samples(generate_latest(metrics.registry).decode())
    labels = (("engine", "0"), ("model_name", "tiny"))
    assert got[(m.STEP_MODELED_SECONDS + "_total", labels)] == engine.modeled_s
    assert got[(m.STEP_LATE_SECONDS + "_total", labels)] == engine.late_s
