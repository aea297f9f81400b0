"""The torch executor behind the real engine core, built the way ``kvgate engine
--executor torch --model DIR`` builds it: prefix hits are served and change nothing."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx
import pytest
from safetensors.torch import save_file

from engine import cli
from engine.core import EngineConfig, EngineCore
from engine.model.tiny import random_weights, write_tiny_model
from engine.request import SamplingParams
from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.servers import ThreadServer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=1)


def _core(model_dir: Path) -> EngineCore:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--executor", "torch", "--model", str(model_dir),
                              "--device", "cpu", "--kv-cache-gib", "0.001"])
    executor, info = cli.make_executor(args, load_tokenizer(model_dir))
    assert info.kv_bytes_per_token == executor.bytes_per_token == 2 * 2 * 2 * 16 * 4
    config = EngineConfig(model_id=info.model_id, num_blocks=info.num_blocks,
                          block_size=args.block_size, max_model_len=info.max_model_len)
    return EngineCore(executor, config)


def _generate(core: EngineCore, rid: str, prompt: list[int]) -> list[int]:
    core.add_request(core.make_request(rid, prompt, SamplingParams(max_tokens=6,
                                                                   ignore_eos=True)))
    tokens: list[int] = []
    while core.has_unfinished():
        for out in core.step().outputs:
            tokens.extend(out.new_token_ids)
        core.check_integrity()
    return tokens


def test_prefix_hit_through_the_core_gives_the_cold_answer(model_dir: Path) -> None:
    shared = list(range(300, 348))  # three full blocks of 16
    first, second = [*shared, 5, 6, 7], [*shared, 9, 8]
    warm = _core(model_dir)
    _generate(warm, "a", first)
    assert warm.stats.prefix_cache_hits == 0
    hit_tokens = _generate(warm, "b", second)
    assert warm.stats.prefix_cache_hits == 48
    cold_tokens = _generate(_core(model_dir), "b", second)
    assert hit_tokens == cold_tokens and len(cold_tokens) == 6


@pytest.mark.parametrize("argv, said", [
    (["--device", "banana"], "--device 'banana' is not a torch device"),
    (["--device", "cpu:7"], "--device 'cpu:7': this machine has 1 cpu device(s)"),
    (["--device", "meta"], "--device 'meta' holds no data to compute on"),
    (["--device", "cpu", "--kv-cache-gib", "1e5"],
     "--kv-cache-gib 100000 is more than the"),
])
def test_kvgate_engine_refuses_a_device_it_cannot_use_before_loading_the_model(
        model_dir: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
        ) -> None:
    assert cli.main(["--executor", "torch", "--model", str(model_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_greedy_chat_on_the_torch_executor_reports_the_likeliest_token_first(
        model_dir: Path) -> None:
    server = EngineServer(_core(model_dir), load_tokenizer(model_dir), model_name="tiny",
                          sleep_modeled_time=False)
    running = ThreadServer(build_app(server)).start()
    try:
        with httpx.Client(base_url=running.url, timeout=60) as http:
            r = http.post("/v1/chat/completions", json={
                "model": "tiny", "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": True,
                "top_logprobs": 3})
    finally:
        running.stop()
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for entry in content:
        top = entry["top_logprobs"]
        values = [t["logprob"] for t in top]
        assert len(top) == 3 and values == sorted(values, reverse=True) and values[0] <= 0
        assert (top[0]["token"], top[0]["logprob"]) == (entry["token"], entry["logprob"])


def test_a_prompt_id_past_the_models_vocabulary_is_a_400(tmp_path: Path) -> None:
    """A checkpoint whose embedding holds fewer rows than its tokenizer's vocabulary: an id
    past the rows is refused up front, never computed (that fails the whole step)."""
    out = write_tiny_model(tmp_path, "llama", seed=2)
    config = json.loads((out / "config.json").read_text())
    config["vocab_size"] = 300
    (out / "config.json").write_text(json.dumps(config))
    save_file(random_weights(config, 2), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    server = EngineServer(_core(out), load_tokenizer(out), model_name="tiny",
                          sleep_modeled_time=False)
    running = ThreadServer(build_app(server)).start()
    try:
        with httpx.Client(base_url=running.url, timeout=60) as http:
            bad = http.post("/v1/completions", json={"model": "tiny", "prompt": [5, 300],
                                                     "max_tokens": 2})
            good = http.post("/v1/completions", json={"model": "tiny", "prompt": [5, 299],
                                                      "max_tokens": 2, "ignore_eos": True})
            # a text whose ids reach past the rows too (this tokenizer's words do)
            text = http.post("/v1/completions", json={"model": "tiny", "max_tokens": 2,
                                                      "prompt": "the quick brown fox jumps"})
            counted = http.post("/tokenize", json={"prompt": "the quick brown fox jumps"})
    finally:
        running.stop()
    assert bad.status_code == 400, bad.text
    assert "300" in bad.json()["error"]["message"] and bad.json()["error"]["param"] == "prompt"
    assert good.status_code == 200, good.text
    assert text.status_code == 400 and "past the model's vocabulary" in text.text, text.text
    assert counted.status_code == 200 and max(counted.json()["tokens"]) >= 300
