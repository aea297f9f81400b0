"""A policy that matches every token of a prompt (``kv_events``, ``radix`` without chunks)
gets a prompt of MiBs encoded in pieces of bounded size: the tokenizer is never handed the
whole text, and the ids are its whole encoding's, inside the engines' special tokens (a
Llama's BOS once, first). A prompt no longer than a piece, and any prompt of a tokenizer
whose encoding may differ split at a space, is encoded in one call as before."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, normalizers, trainers

from gateway.fleet import Fleet
from gateway.request_parse import ParsedRequest
from gateway.routing import Router
from kvwire.bounded_encoding import WHOLE_PIECE_CHARS
from kvwire.tokenizer import PromptTokenizer
from kvwire.tokenizer_build import sample_text
from policies.registry import build_policy
from tests.support.bos_tokenizer import BOS, bos_tokenizer
from tests.support.recording_tokenizer import RecordingTokenizer

BLOCK = sample_text(random.Random(3), 4000)  # ~28 KB of words and punctuation


def completion(text: str) -> ParsedRequest:
    return ParsedRequest("completions", {}, "m", True, text, None, None, None, None)


def routed_ids(policy: dict[str, Any], recording: RecordingTokenizer, text: str,
               memo_size: int = 2048) -> list[int]:
    """The ids ``policy``'s router (the gateway's default memo) routes ``text`` by."""
    router = Router(build_policy(policy), PromptTokenizer(recording, memo_size=memo_size),
                    Fleet([]), 1)
    try:
        assert router.policy.tokens_needed is None  # the whole prompt's ids
        recording.given.clear()
        return list(router.build(completion(text)).tokens)
    finally:
        router.close()


@pytest.mark.parametrize("policy", [{"name": "kv_events"},
                                    {"name": "radix", "chunk_chars": 0}])
def test_a_prompt_of_mibs_is_encoded_in_bounded_pieces_to_its_whole_ids(
        tmp_path: Path, policy: dict[str, Any]) -> None:
    directory, bos = bos_tokenizer(tmp_path)
    recording = RecordingTokenizer(Tokenizer.from_file(str(directory / "tokenizer.json")))
    text = f"{BOS} " + " ".join([BLOCK] * 80)  # 2.2 MiB, a special token written in it
    assert len(text) > 2 * 2**20
    ids = routed_ids(policy, recording, text)
    assert 0 < max(recording.given) <= WHOLE_PIECE_CHARS, max(recording.given)
    assert sum(recording.given) >= len(text)  # all of it read
    whole = recording.inner.encode(text, add_special_tokens=True).ids  # as the engines do
    assert ids == whole
    assert ids[:2] == [bos, bos] and ids.count(bos) == 2  # the BOS first, and the one written


def test_a_prompt_no_longer_than_a_piece_is_encoded_in_one_call(tmp_path: Path) -> None:
    directory, _ = bos_tokenizer(tmp_path)
    recording = RecordingTokenizer(Tokenizer.from_file(str(directory / "tokenizer.json")))
    text = BLOCK + " " + BLOCK[: WHOLE_PIECE_CHARS - len(BLOCK) - 1]
    assert len(text) == WHOLE_PIECE_CHARS
    ids = routed_ids({"name": "kv_events"}, recording, text, memo_size=0)
    assert recording.given == [len(text)]
    assert ids == recording.inner.encode(text, add_special_tokens=True).ids


def test_a_tokenizer_whose_encoding_may_differ_split_at_a_space_encodes_whole() -> None:
    # SentencePiece-like: a normalizer prepends "▁" to the text (a piece would get its own)
    # and nothing pre-tokenizes it
    rng = random.Random(0)
    words = ["the", "parties", "agree", "term", "hello", "internationalization"]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.train_from_iterator([" ".join(rng.choice(words) for _ in range(40)) for _ in range(50)],
                            trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                special_tokens=["<unk>"]))
    assert tok.pre_tokenizer is None and isinstance(tok.normalizer, normalizers.Sequence)
    recording = RecordingTokenizer(tok)
    text = " ".join(rng.choice(words) for _ in range(40_000))  # 4 pieces' worth
    assert len(text) > 3 * WHOLE_PIECE_CHARS
    ids = routed_ids({"name": "kv_events"}, recording, text, memo_size=0)
    assert max(recording.given) == len(text)
    assert ids == tok.encode(text, add_special_tokens=False).ids
