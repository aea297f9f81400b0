"""A text prompt reaches the model inside its tokenizer's special tokens, as vLLM encodes
it (``add_special_tokens``: a Llama's BOS first); a rendered chat carries its template's.
SGLang's ``/generate`` encodes a ``text`` prompt the same way, as SGLang does and as the
gateway routes it (its KV blocks are those the gateway's prefix index looks for)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kvwire.tokenizer import load_tokenizer
from tests.support.bos_tokenizer import bos_tokenizer
from tests.support.loop_check import served_engine

TEXT = "the term is five years"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, int]]:
    """An engine serving a tokenizer with a BOS: its HTTP client, the tokenizer, the BOS."""
    directory, bos = bos_tokenizer(tmp_path_factory.mktemp("bos"))
    tokenizer = load_tokenizer(directory)
    with served_engine(tokenizer, "m", num_blocks=256, vocab=(259, 4096),
                       max_model_len=512) as http:
        yield http, tokenizer, bos


def test_a_text_prompt_gets_the_bos_and_a_chat_its_templates_one(
        engine: tuple[Any, Any, int]) -> None:
    http, tokenizer, bos = engine
    ids = tokenizer.encode(TEXT)
    said = http.post("/tokenize", json={"model": "m", "prompt": TEXT}).json()
    assert said["tokens"] == [bos, *ids]
    done = http.post("/v1/completions", json={"model": "m", "prompt": [TEXT, TEXT],
                                              "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == 2 * (len(ids) + 1), done
    one = http.post("/v1/completions", json={"model": "m", "prompt": TEXT,
                                             "max_tokens": 1}).json()
    assert one["usage"]["prompt_tokens"] == len(ids) + 1, one
    chat = http.post("/tokenize", json={"model": "m", "messages": [
        {"role": "user", "content": TEXT}]}).json()["tokens"]
    assert chat[0] == bos and chat.count(bos) == 1


def test_generate_text_prompt_is_encoded_with_the_bos(engine: tuple[Any, Any, int]) -> None:
    http, tokenizer, bos = engine
    ids = tokenizer.encode(TEXT)
    one = http.post("/generate", json={"text": TEXT, "return_prompt_token_ids": True,
                                       "sampling_params": {"max_new_tokens": 1}})
    assert one.status_code == 200, one.text
    assert one.json()["prompt_token_ids"] == [bos, *ids]
    assert one.json()["meta_info"]["prompt_tokens"] == len(ids) + 1
    # the ids /v1/completions computes for the same text
    said = http.post("/tokenize", json={"model": "m", "prompt": TEXT}).json()
    assert said["tokens"] == [bos, *ids]
    batch = http.post("/generate", json={
        "text": [TEXT, "other words"],
        "sampling_params": {"max_new_tokens": 1}}).json()
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == \
        [len(ids) + 1, len(tokenizer.encode("other words")) + 1]
    given = http.post("/generate", json={
        "input_ids": ids, "return_prompt_token_ids": True,
        "sampling_params": {"max_new_tokens": 1}}).json()
    assert given["prompt_token_ids"] == ids  # token ids reach the model as given
