"""A text prompt reaches the model inside its tokenizer's special tokens, as vLLM encodes
it (``add_special_tokens``: a Llama's BOS first); a rendered chat carries its template's."""

from __future__ import annotations

from pathlib import Path

from kvwire.tokenizer import load_tokenizer
from tests.support.bos_tokenizer import bos_tokenizer
from tests.support.loop_check import served_engine


def test_a_text_prompt_gets_the_bos_and_a_chat_its_templates_one(tmp_path: Path) -> None:
    directory, bos = bos_tokenizer(tmp_path)
    tokenizer = load_tokenizer(directory)
    with served_engine(tokenizer, "m", num_blocks=256, vocab=(259, 4096),
                       max_model_len=512) as http:
        text = "the term is five years"
        ids = tokenizer.encode(text)
        said = http.post("/tokenize", json={"model": "m", "prompt": text}).json()
        assert said["tokens"] == [bos, *ids]
        done = http.post("/v1/completions", json={"model": "m", "prompt": [text, text],
                                                  "max_tokens": 1}).json()
        assert done["usage"]["prompt_tokens"] == 2 * (len(ids) + 1), done
        one = http.post("/v1/completions", json={"model": "m", "prompt": text,
                                                 "max_tokens": 1}).json()
        assert one["usage"]["prompt_tokens"] == len(ids) + 1, one
        chat = http.post("/tokenize", json={"model": "m", "messages": [
            {"role": "user", "content": text}]}).json()["tokens"]
        assert chat[0] == bos and chat.count(bos) == 1

