"""TextStream releases what decoding the whole output would give, cut at the first stop
string, with tokenizers whose unfinished characters decode to one U+FFFD per byte
(byte fallback, as Llama-2's) or one per sequence (the project's byte-level BPE), and
decodes a bounded window of tokens per push, not the whole output."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers

from engine.text_stream import TextStream
from kvwire.tokenizer import PromptTokenizer, load_tokenizer


def byte_fallback_tokenizer() -> PromptTokenizer:
    """A SentencePiece-style BPE with byte fallback (``<0xE6>`` tokens), its decoder as
    Llama-2's tokenizer.json spells it: a character it has no piece for is one token per
    byte, and each byte of an unfinished one decodes to its own U+FFFD."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ("▁", "a", "b", "▁a", "▁b", "ab"):
        vocab[piece] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a"), ("▁", "b"), ("a", "b")],
                               byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PromptTokenizer(tok)


BYTE_FALLBACK = byte_fallback_tokenizer()
WINDOW = 64  # tokens a push may decode: a few recent ones, never the whole output
PROJECT = load_tokenizer(None)


def streamed(tok: PromptTokenizer, ids: Sequence[int], stops: Sequence[str] = (),
             include: bool = False) -> str:
    ts = TextStream(tok, stops, include_stop=include)
    out = ""
    for t in ids:  # one token a push, as the engine pushes them
        out += ts.push([t])
        if ts.stopped:
            return out
    return out + ts.flush()


def reference(tok: PromptTokenizer, ids: Sequence[int], stops: Sequence[str],
              include: bool = False) -> str:
    """Decode all tokens so far after each one; cut at the first stop string found."""
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n])
        found = [(i, s) for s in stops if (i := text.find(s)) >= 0]
        if found:
            cut, stop = min(found)
            return text[:cut + len(stop) if include else cut]
    return tok.decode(ids)


def test_byte_fallback_characters_stream_whole() -> None:
    ids = BYTE_FALLBACK.encode("ab 日本 ab")
    assert BYTE_FALLBACK.decode(ids[:5]).endswith("\ufffd\ufffd")  # one per byte
    for stops in ((), ("zz",), ("本 a",)):
        assert streamed(BYTE_FALLBACK, ids, stops) == reference(BYTE_FALLBACK, ids, stops)
    assert streamed(BYTE_FALLBACK, ids) == "ab 日本 ab"
    assert streamed(BYTE_FALLBACK, ids, ("本 a",)) == "ab 日"


def test_a_stop_string_ending_in_a_split_character_leaks_nothing() -> None:
    ids = PROJECT.encode("aé")
    assert len(ids) == 3  # 'a', then the two bytes of 'é'
    ts = TextStream(PROJECT, ["aé"])
    assert [ts.push([t]) for t in ids] == ["", "", ""]
    assert ts.stopped and ts.stop == "aé"
    assert streamed(PROJECT, PROJECT.encode("xaéy"), ["aé"], include=True) == "xaé"


@pytest.mark.parametrize("tok", [PROJECT, BYTE_FALLBACK], ids=["byte-level", "fallback"])
def test_random_stops_match_decoding_everything(tok: PromptTokenizer) -> None:
    rng = random.Random(7)
    texts = ["héllo wörld ünïcode ✓ 日本語のテキスト 🎉🎉 end. ", "abc abc abcd <stop> xyz",
             "a\n\nb\n\nc", "ab 日本 ab aé 🎉b"]
    for _ in range(150):
        ids = tok.encode(rng.choice(texts) * rng.randint(1, 2))
        full = tok.decode(ids)
        stops = []
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(full))
            stops.append(full[i:i + rng.randint(1, 6)])
        include = rng.random() < 0.3
        assert streamed(tok, ids, stops, include) == reference(tok, ids, stops, include), \
            (ids, stops, include)


class CountingDecoder:
    def __init__(self, tok: PromptTokenizer) -> None:
        self.tok = tok
        self.longest = 0

    def decode(self, ids: Sequence[int]) -> str:
        self.longest = max(self.longest, len(ids))
        return self.tok.decode(ids)


def test_each_push_decodes_a_bounded_window() -> None:
    ids = PROJECT.encode("héllo wörld ✓ 日本語 🎉 " * 200)
    assert len(ids) > 2000
    decoder = CountingDecoder(PROJECT)
    ts = TextStream(decoder, ["<never>"])
    out = "".join(ts.push([t]) for t in ids) + ts.flush()
    assert out == PROJECT.decode(ids)
    assert decoder.longest <= WINDOW
    # a run of invalid bytes that never completes is taken as it decodes, not waited on
    invalid = PROJECT.encode("é")[:1] * 100
    decoder.longest = 0
    out = streamed(decoder, invalid)  # type: ignore[arg-type]
    assert out == PROJECT.decode(invalid)
    assert decoder.longest <= WINDOW


def test_stop_strings_are_looked_for_past_min_tokens_only() -> None:
    ids = [PROJECT.encode(w)[0] for w in ("a", "b", "c", "d")]
    assert len(ids) == 4 and PROJECT.decode(ids) == "abcd"
    for min_tokens, text, stopped in ((0, "a", True), (1, "a", True), (2, "ab", True),
                                      (3, "abcd", False)):
        stream = TextStream(PROJECT, ["b", "c"], min_tokens=min_tokens)
        out = "".join(stream.push([t]) for t in ids) + stream.flush()
        # min_tokens 2: "b" is the second token's text, within the first two: not a stop
        assert (out, stream.stopped) == (text, stopped), min_tokens
