"""``BoundedEncoder.encode_whole`` reads a text in pieces only for a tokenizer whose
encoding splits at every cut (``splits_at_cuts``), and there gives exactly the whole
encoding, on texts of every shape, for each kind of tokenizer the suite builds; any other
tokenizer is read whole."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from kvwire.tokenizer import PromptTokenizer
from kvwire.tokenizer_build import ASSET_DIR
from tests.support.recording_tokenizer import RecordingTokenizer

ATOMS = ("the ", "parties ", "  ", "\n", "\n\n ", "中文字符", "😀", "a", "aaaa", " ", "=",
         "word", ".", "   x", "\t", "é", " internationalization", "<|im_start|>", "it's ",
         "4,500 ", "$1.5k ", "\u00a0", "Ünïcode ", "--")
# Llama 3's pre-tokenizer regex (Qwen2's differs only in its digits)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def project() -> Tokenizer:
    return Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json"))


def llama3_like() -> Tokenizer:
    tok = project()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def trained(pre: Any, normalizer: Any = None, fallback: bool = False) -> Tokenizer:
    rng = random.Random(0)
    words = ["the", "parties", "agree", "term", "中文", "字符", "hello", "internationalization"]
    tok = Tokenizer(models.BPE(byte_fallback=fallback, unk_token="<unk>", fuse_unk=True))
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre is not None:
        tok.pre_tokenizer = pre
    bytes_ = [f"<0x{i:02X}>" for i in range(256)] if fallback else []
    tok.train_from_iterator([" ".join(rng.choice(words) for _ in range(40)) for _ in range(300)],
                            trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                special_tokens=["<unk>", *bytes_]))
    return tok


def word_level() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "parties": 2, "a": 3},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def bos() -> Tokenizer:
    tok = project()
    tok.add_special_tokens(["<s>"])
    return tok


def rstrip() -> Tokenizer:
    tok = project()
    tok.add_special_tokens([AddedToken("<mask>", rstrip=True)])  # takes the spaces after it
    return tok


def no_regex() -> Tokenizer:
    tok = project()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return tok


SPLITS = {
    "byte-level": project, "llama-3-like": llama3_like, "with-bos": bos,
    "whitespace-word-level": word_level,
    "metaspace": lambda: trained(pre_tokenizers.Metaspace(prepend_scheme="first"),
                                 fallback=True),
    "nfkc-byte-level": lambda: trained(pre_tokenizers.ByteLevel(), normalizers.NFKC()),
}
WHOLE = {
    "prepend-sentencepiece": lambda: trained(
        pre_tokenizers.Metaspace(prepend_scheme="never"),
        normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
        fallback=True),
    "no-pre-tokenizer": lambda: trained(None, normalizers.Replace(" ", "▁"), fallback=True),
    "byte-level-without-regex": no_regex, "rstrip-added-token": rstrip,
    "strip-normalizer": lambda: trained(pre_tokenizers.ByteLevel(), normalizers.Strip()),
    "json-unread": lambda: RecordingTokenizer(project(), hide_form=True),
}


def texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(25):
        atoms = rng.sample(ATOMS, rng.randint(1, len(ATOMS)))
        out.append("".join(rng.choice(atoms) for _ in range(rng.choice([40, 400, 2000]))))
    return out


@pytest.mark.parametrize("kind", sorted(SPLITS))
def test_a_text_read_in_pieces_encodes_to_its_whole_encoding(kind: str) -> None:
    tok = PromptTokenizer(SPLITS[kind]())
    assert tok.bounded.splits_at_cuts
    for i, text in enumerate(texts(sorted(SPLITS).index(kind))):
        assert tok.bounded.encode_whole(text, piece_chars=24 + i) == tok.encode(text), text


@pytest.mark.parametrize("kind", sorted(WHOLE))
def test_a_tokenizer_whose_encoding_may_not_split_at_a_cut_is_read_whole(kind: str) -> None:
    inner = WHOLE[kind]()
    recording = inner if isinstance(inner, RecordingTokenizer) else RecordingTokenizer(inner)
    tok = PromptTokenizer(recording)
    assert not tok.bounded.splits_at_cuts
    text = "the parties agree " * 100
    recording.given.clear()
    whole = tok.bounded.encode_whole(text, piece_chars=64)
    assert recording.given == [len(text)]  # handed over in one piece
    assert whole == tok.encode(text)
