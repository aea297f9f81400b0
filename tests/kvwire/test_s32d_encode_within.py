"""``BoundedEncoder.encode_within`` never refuses a text that fits and never over-states
what it proves (its ``at_least`` is at most the text's true count), and ``encode_tail``
gives the whole encoding's last tokens, on texts of every shape: spaces and none, runs of
whitespace, CJK, emoji, for a byte-level tokenizer and a SentencePiece-like one (a
``Prepend`` normalizer and byte fallback, whose pieces encode their first word otherwise
than the whole does). ``max_token_chars`` is None where a token may stand for any run."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import ASSET_DIR

ATOMS = ("the ", "parties ", "  ", "\n", "\n\n ", "中文字符", "😀", "a", "aaaa", " ", "=",
         "word", ".", "   x", "\t", "é", " internationalization")


def _sentencepiece_like() -> PromptTokenizer:
    rng = random.Random(0)
    words = ["the", "parties", "agree", "term", "中文", "字符", "hello", "internationalization"]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator([" ".join(rng.choice(words) for _ in range(40)) for _ in range(300)],
                            trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", *bytes_],
                                                show_progress=False))
    return PromptTokenizer(tok)


@pytest.mark.parametrize("kind", ["byte-level", "sentencepiece-like"])
def test_bounded_encodings_agree_with_the_whole_encoding(kind: str) -> None:
    tok = load_tokenizer(None) if kind == "byte-level" else _sentencepiece_like()
    assert tok.bounded.max_token_chars is not None
    rng = random.Random(7)
    refused = 0
    for _ in range(60):
        atoms = rng.sample(ATOMS, rng.randint(1, len(ATOMS)))
        text = "".join(rng.choice(atoms) for _ in range(rng.choice([30, 3000, 12000])))
        whole = tok.encode(text)
        for limit in (1, 40, len(whole) - 1, len(whole)):
            if limit < 0:
                continue
            got = tok.bounded.encode_within(text, limit)
            if got.ids is None:
                refused += 1
                assert limit < got.at_least <= len(whole), (limit, got.at_least, len(whole))
            else:
                assert got.ids == whole
        keep = rng.choice([1, 7, 300])
        assert tok.bounded.encode_tail(text, keep) == whole[-keep:]
    assert refused > 25  # the bounded reads were taken


def test_a_text_far_past_the_limit_is_refused_by_its_length_alone() -> None:
    tok = load_tokenizer(None)
    longest = tok.bounded.max_token_chars
    assert longest is not None
    got = tok.bounded.encode_within("ab " * 1_000_000, 100)
    assert got.ids is None and got.at_least == -(-3_000_000 // longest)
    many = tok.bounded.encode_many_within(["short text", "ab " * 1_000_000], 100)
    assert many[0].ids == tok.encode("short text") and many[1].ids is None


def test_no_longest_token_where_a_token_may_stand_for_any_run() -> None:
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert PromptTokenizer(wordpiece).bounded.max_token_chars is None
    dropping = Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json"))
    dropping.normalizer = normalizers.BertNormalizer()  # drops control characters
    assert PromptTokenizer(dropping).bounded.max_token_chars is None


def test_a_text_without_spaces_is_refused_by_its_non_ascii_runs() -> None:
    """CJK or emoji with no space: no piece ends at a cut, and the text is shorter than the
    limit times the longest token; its runs of non-ASCII bytes still prove it too long."""
    tok = load_tokenizer(None)
    for text in ("中文字符" * 3000, "😀" * 12_000):
        assert len(text) < 1000 * (tok.bounded.max_token_chars or 0)
        got = tok.bounded.encode_within(text, 1000)
        assert got.ids is None and 1000 < got.at_least <= len(tok.encode(text))
