"""Replicas with another tokenizer (one token per word) behind a gateway using its
built-in BPE (about two tokens per word): once calibrated from the replicas' ``usage``,
the policies' predicted cached tokens, in the replicas' tokens, match what they report."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import openai
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from kvwire.tokenizer_build import WORDS, sample_text
from tests.support.fleets import SIM_ENGINE, start_fleet
from tests.support.processes import Processes

pytestmark = pytest.mark.slow


def word_tokenizer(directory: Path) -> Path:
    """A whitespace word-level tokenizer over the project's word list."""
    vocab = {"[UNK]": 0, "<|endoftext|>": 1}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    return directory


@pytest.mark.parametrize("policy", ["cost", "radix"])
def test_predicted_cached_tokens_are_in_the_replicas_units(
        spawn: Processes, tmp_path: Path, policy: str) -> None:
    words = word_tokenizer(tmp_path / "words")
    fleet = start_fleet(spawn, tmp_path, {"name": policy},
                        engine=(*SIM_ENGINE, "--tokenizer", str(words)))
    gateway = fleet.gateway
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)
    rng = random.Random(3)
    docs = [sample_text(rng, 400) for _ in range(4)]

    def prompt() -> str:
        return f"{rng.choice(docs)}\n\nQuestion: {sample_text(rng, 12)}"

    for _ in range(12):  # warm-up: every document cached somewhere, the ratio learned
        client.completions.create(model="sim-llama", prompt=prompt(), max_tokens=2)
    predicted = reported = 0
    for _ in range(8):
        text = prompt()
        body = {"model": "sim-llama", "prompt": text, "max_tokens": 2}
        explain = httpx.post(f"{fleet.admin}/admin/explain", json=body,
                             headers=fleet.admin_headers).json()
        ratio = explain["replica_tokens_per_gateway_token"]
        assert 0.35 < ratio < 0.7  # ~1 replica token per ~2 BPE tokens
        raw = client.completions.with_raw_response.create(**body)
        assert raw.headers["x-kvgate-replica"] == explain["chosen"]
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        assert cached > 300  # the document (400 words) was served from cache
        predicted += round(explain["matched_tokens"] * ratio)
        reported += cached
    assert abs(predicted - reported) <= 0.15 * reported, (predicted, reported)
