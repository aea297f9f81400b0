"""What RL clients (slime, miles) ask of SGLang's native API on the engine: log
probabilities on ``/generate``, special tokens kept, and the control endpoints
(``/abort_request``, ``/v1/loads``, ``/get_load``, ``/get_model_info``, ``/flush_cache``),
over raw HTTP on real uvicorn servers (sim executor)."""

from __future__ import annotations

import concurrent.futures
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import FailsAfter, make_core
from tests.support.engine_servers import LiveEngine, serve_engine
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

MODEL = "tiny-sim"
SPAN = 4096 - 259  # the sim's token range in ``serve_engine``: its logprob is -log(SPAN)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _generate(http: httpx.Client, body: dict[str, Any]) -> Any:
    r = http.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _events(lines: Iterator[str]) -> list[Any]:
    """A stream's ``data:`` events, decoded, up to and without ``[DONE]``."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            if line == "data: [DONE]":
                return out
            out.append(json.loads(line[6:]))
    raise AssertionError(f"the stream ended without [DONE] after {len(out)} events")


def test_return_logprob_gives_one_entry_per_output_token_as_slime_reads_them(
        live: LiveEngine) -> None:
    # slime's request: it rebuilds the answer's tokens from output_token_logprobs alone
    body = {"input_ids": list(range(300, 340)), "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                "max_new_tokens": 6, "stop": None, "stop_token_ids": None,
                                "skip_special_tokens": False, "no_stop_trim": True,
                                "spaces_between_special_tokens": False}}
    out = _generate(live.http, body)
    meta = out["meta_info"]
    assert meta["input_token_logprobs"] == []
    entries = meta["output_token_logprobs"]
    assert [e[1] for e in entries] == out["output_ids"] and len(entries) == 6
    # the sim draws uniformly from its range: each token's stand-in log-probability
    assert all(e[0] == pytest.approx(-math.log(SPAN)) and e[2] is None for e in entries)
    assert "output_top_logprobs" not in meta
    # top alternatives, with each token's text
    top = _generate(live.http, {**body, "top_logprobs_num": 2,
                                "return_text_in_logprobs": True})["meta_info"]
    assert top["input_top_logprobs"] == []
    assert len(top["output_top_logprobs"]) == 6
    for entry, alternatives in zip(top["output_token_logprobs"], top["output_top_logprobs"],
                                   strict=True):
        assert entry[2] == live.http.post("/detokenize",
                                          json={"tokens": [entry[1]]}).json()["prompt"]
        assert len(alternatives) == 2 and alternatives[0] == entry
    # a batch may ask for them per prompt
    both = _generate(live.http, {"text": ["one", "two"], "return_logprob": [True, False],
                                 "sampling_params": {"max_new_tokens": 2}})
    assert len(both[0]["meta_info"]["output_token_logprobs"]) == 2
    assert "output_token_logprobs" not in both[1]["meta_info"]


def test_a_stream_carries_every_logprob_so_far_and_the_prompt_ids_when_asked(
        live: LiveEngine) -> None:
    ids = list(range(400, 420))
    body = {"input_ids": ids, "stream": True, "return_logprob": True,
            "logprob_start_len": len(ids), "return_prompt_token_ids": True,
            "sampling_params": {"max_new_tokens": 5, "stream_interval": 2}}
    with live.http.stream("POST", "/generate", json=body) as r:
        events = _events(r.iter_lines())
    assert [len(e["meta_info"]["output_token_logprobs"]) for e in events] == [1, 3, 5]
    for e in events:  # cumulative, as the text and output ids
        assert [x[1] for x in e["meta_info"]["output_token_logprobs"]] == e["output_ids"]
        assert e["prompt_token_ids"] == ids


def test_special_tokens_are_kept_in_the_text_when_asked() -> None:
    # a sim whose every token is special: <|endoftext|>, <|im_start|>, <|im_end|>
    for engine in serve_engine(LiveEngine, MODEL, vocab=(0, 3)):
        body = {"input_ids": [300, 301], "sampling_params": {"max_new_tokens": 4}}
        skipped = _generate(engine.http, body)
        assert skipped["text"] == ""
        kept = _generate(engine.http, {**body, "sampling_params": {
            "max_new_tokens": 4, "skip_special_tokens": False}})
        names = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
        assert kept["output_ids"] == skipped["output_ids"]
        assert kept["text"] == "".join(names[t] for t in kept["output_ids"])


def test_abort_request_ends_requests_as_aborted_and_loads_count_them() -> None:
    for engine in serve_engine(LiveEngine, MODEL):
        http = engine.http
        long = {"text": "a long answer", "sampling_params": {"max_new_tokens": 400,
                                                             "ignore_eos": True}}
        idle = http.get("/v1/loads").json()
        assert idle["dp_rank_count"] == 1 and idle["aggregate"]["total_reqs"] == 0
        assert idle["loads"][0]["max_total_num_tokens"] == 256 * 4
        with http.stream("POST", "/generate", json={**long, "rid": "s", "stream": True}) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            load = http.get("/v1/loads").json()["loads"][0]
            assert load["num_running_reqs"] + load["num_waiting_reqs"] == 1
            assert load["num_total_reqs"] == 1 and load["num_used_tokens"] > 0
            legacy = http.get("/get_load").json()
            assert legacy[0]["num_reqs"] == 1 and legacy[0]["dp_rank"] == 0
            assert http.post("/abort_request", json={"rid": "s"}).status_code == 200
            events = _events(lines)
        reason = events[-1]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and reason["message"]
        assert events[-1]["meta_info"]["completion_tokens"] < 400
        # abort_all reaches a whole answer too: it comes back finished as aborted (once the
        # aborted stream has left: else its request was the one seen running, and abort_all
        # came before the whole answer's request was added)
        wait_until(lambda: http.get("/v1/loads").json()["aggregate"]["total_reqs"] == 0,  # noqa: B023
                   10, "the aborted stream to leave the engine")
        whole = {**long, "rid": "w"}
        with httpx.Client(base_url=engine.url, timeout=30) as other:
            core = engine.server.core
            pending = ThreadResult(lambda: other.post("/generate", json=whole))  # noqa: B023
            wait_until(lambda: core.num_running == 1, 10,  # noqa: B023
                       "the request to run")
            assert http.post("/abort_request", json={"abort_all": True}).status_code == 200
            answer = pending.get()
        assert answer.status_code == 200, answer.text
        assert answer.json()["meta_info"]["finish_reason"]["type"] == "abort"
        wait_until(lambda: http.get("/v1/loads").json()["aggregate"]["total_reqs"] == 0,  # noqa: B023
                   10, "the aborted requests to leave the engine")
        assert http.post("/abort_request", json={"rid": "gone"}).status_code == 200
        bad = http.post("/abort_request", json={})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "rid"


def test_model_info_and_flush_cache(live: LiveEngine) -> None:
    info = live.http.get("/get_model_info").json()
    assert info["model_path"] == MODEL and info["is_generation"] is True
    assert info["weight_version"] == "default"
    body = {"text": "flush me " * 20, "sampling_params": {"max_new_tokens": 1}}
    _generate(live.http, body)
    assert _generate(live.http, body)["meta_info"]["cached_tokens"] > 0
    for method in ("GET", "POST"):
        r = live.http.request(method, "/flush_cache")
        assert r.status_code == 200 and r.text == "Cache flushed."
        assert _generate(live.http, body)["meta_info"]["cached_tokens"] == 0


def test_a_stream_that_fails_ends_with_an_abort_in_meta_info() -> None:
    core = make_core(num_blocks=64, vocab=(259, 4096))
    core.executor = FailsAfter(core.executor, steps=3)
    srv = EngineServer(core, load_tokenizer(None), model_name=MODEL, sleep_modeled_time=True)
    server = ThreadServer(build_app(srv)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http, http.stream(
                "POST", "/generate", json={"text": "doomed", "stream": True,
                                           "sampling_params": {"max_new_tokens": 20}}) as r:
            events = _events(r.iter_lines())
    finally:
        server.stop()
    meta = events[-1]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["finish_reason"]["status_code"] == 500  # the step failed, not the engine
    assert "device lost" in meta["finish_reason"]["message"]
    assert meta["completion_tokens"] == len(events[-1]["output_ids"]) < 20


class ThreadResult:
    """Runs ``fn`` on a thread; ``get`` waits for its result."""

    def __init__(self, fn: Any) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._future = self._pool.submit(fn)

    def get(self) -> Any:
        try:
            return self._future.result(timeout=30)
        finally:
            self._pool.shutdown()
