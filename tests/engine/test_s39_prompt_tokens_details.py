"""``kvgate engine --no-prompt-tokens-details`` answers as vLLM does without
``--enable-prompt-tokens-details``: usage without ``prompt_tokens_details`` (the gateway
then cannot read the cached tokens from it); its /metrics still count the cache's hits."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from engine import cli as engine_cli
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
LONG = " ".join(f"clause {i} of the agreement binds the parties." for i in range(40))


@pytest.fixture(scope="module")
def untold() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL, {"prompt_tokens_details": False})


def test_answers_tell_no_cached_tokens(untold: LiveEngine) -> None:
    for _ in range(2):  # the second finds the prompt cached
        answer = untold.http.post("/v1/completions", json={
            "model": MODEL, "prompt": LONG, "max_tokens": 2}).json()
        assert "prompt_tokens_details" not in answer["usage"], answer["usage"]
        assert answer["usage"]["prompt_tokens"] > 100
    lines = [line for line in untold.http.get("/metrics").text.splitlines()
             if line.startswith("vllm:prefix_cache_hits_total")]
    assert lines and float(lines[0].split()[-1]) > 100, lines
    chat = untold.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 2,
        "stream": True, "stream_options": {"include_usage": True}}).text
    assert '"prompt_tokens":' in chat and "prompt_tokens_details" not in chat


def test_the_flag_turns_them_off() -> None:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    told = engine_cli.build_server(parser.parse_args(["--kv-cache-gib", "1"]))
    untold = engine_cli.build_server(parser.parse_args(["--kv-cache-gib", "1",
                                                        "--no-prompt-tokens-details"]))
    assert (told.prompt_tokens_details, untold.prompt_tokens_details) == (True, False)
