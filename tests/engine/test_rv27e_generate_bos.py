"""SGLang's ``/generate`` encodes a ``text`` prompt inside the tokenizer's special tokens
(a Llama's BOS first), as SGLang does, as ``/v1/completions`` does, and as the gateway
routes it (its KV blocks are those the gateway's prefix index looks for)."""

from __future__ import annotations

from pathlib import Path

from kvwire.tokenizer import load_tokenizer
from tests.support.bos_tokenizer import bos_tokenizer
from tests.support.loop_check import served_engine


def test_generate_text_prompt_is_encoded_with_the_bos(tmp_path: Path) -> None:
    directory, bos = bos_tokenizer(tmp_path)
    tokenizer = load_tokenizer(directory)
    with served_engine(tokenizer, "m", num_blocks=256, vocab=(259, 4096),
                       max_model_len=512) as http:
        text = "the term is five years"
        ids = tokenizer.encode(text)
        one = http.post("/generate", json={"text": text, "return_prompt_token_ids": True,
                                           "sampling_params": {"max_new_tokens": 1}})
        assert one.status_code == 200, one.text
        assert one.json()["prompt_token_ids"] == [bos, *ids]
        assert one.json()["meta_info"]["prompt_tokens"] == len(ids) + 1
        # the ids /v1/completions computes for the same text
        said = http.post("/tokenize", json={"model": "m", "prompt": text}).json()
        assert said["tokens"] == [bos, *ids]
        batch = http.post("/generate", json={
            "text": [text, "other words"],
            "sampling_params": {"max_new_tokens": 1}}).json()
        assert [b["meta_info"]["prompt_tokens"] for b in batch] == \
            [len(ids) + 1, len(tokenizer.encode("other words")) + 1]
        given = http.post("/generate", json={
            "input_ids": ids, "return_prompt_token_ids": True,
            "sampling_params": {"max_new_tokens": 1}}).json()
        assert given["prompt_token_ids"] == ids  # token ids reach the model as given

