"""Encodings of a text far longer than a model's context whose memory stays bounded.

A long prompt costs a tokenizer memory in proportion (HF ``tokenizers`` builds an
``Encoding`` of some hundred bytes a token); these read a bounded part of it instead:

- ``encode_within`` proves a text encodes to more than a limit from a bounded read (or from
  its length alone: ``max_token_chars``, the longest token's characters) and encodes whole
  only a text that may fit (``encode_many_in_all``: of many texts, also stopping once their
  sum passes a bound on all of them);
- ``encode_tail`` reads a text's last tokens from its end (``truncate_prompt_tokens``);
- ``encode_whole`` gives a text's whole encoding read in pieces of ``WHOLE_PIECE_CHARS``
  (the gateway's policies that match every token of a prompt), where the tokenizer's
  encoding splits at every cut (``splits_at_cuts``).

All three rest on the cuts ``PromptTokenizer.encode_prefix`` and ``kvwire.whole_encoding`` rely
on (see ``BoundedEncoder``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvwire.whole_encoding import space_cut

# ``encode_within`` encodes a text whole when its UTF-8 bytes are at most this many per token
# of the limit (a token takes a byte at least, so its encoding holds about that many tokens
# per token of the limit at most: typical text, 2 to 5 bytes a token, is encoded once); else
# it reads pieces of at most _PIECE_CHARS_PER_TOKEN characters per token of the limit
_WHOLE_BYTES_PER_TOKEN = 6
_PIECE_CHARS_PER_TOKEN = 3
_MIN_READ_CHARS = 4096
# a cut: a space right after a character that is not whitespace (``space_cut``'s positions)
_CUT = re.compile(r"(?<=\S) ")
# normalizers that never drop characters, and the most input characters one of their
# output characters stands for (Unicode composition joins at most 4 code points into one)
_NORMALIZER_SHRINK = {"NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1, "ByteLevel": 1,
                      "NFC": 4, "NFKC": 4}
# ``encode_whole`` reads pieces of about this many characters (HF's ``Encoding`` of one,
# some hundred bytes a token, costs a few MB); a text no longer is encoded in one call
WHOLE_PIECE_CHARS = 1 << 16
# normalizers that map each character alone (not ``Prepend``, which marks the text's start,
# nor ``Strip``, its ends): a text split at a space normalizes to its parts' normalized
_PER_CHARACTER = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "ByteLevel"}
# what ``splits_at_cuts`` checks a tokenizer's pre-tokenizer and encoding on: a cut after
# each kind of character a text holds (letters, digits, punctuation, quotes, accents, CJK,
# emoji, a special token) and whitespace that is not a cut (runs, newlines, tabs)
_CUT_SAMPLE = ("The parties' term (clause 4.2), 4,500 USD ($1.5k) ends 2027-01-31: don't  "
               "it's x\n y\t z   héllo wörld Ünïcode 中文 字符。 😀 👍🏽 x<|im_start|> [a] {b} "
               "'q' \"r\" a.b c-d e_f g/h i@j k#l ... -- !! ?? émigré\u00a0x end")


@dataclass(frozen=True, slots=True)
class BoundedEncoding:
    """``encode_within``'s answer: ``ids``, the text's whole encoding (``at_least`` its
    length), or None when the text was proven to encode to more than the limit asked
    without being encoded whole; ``at_least`` then a count its encoding reaches."""

    ids: list[int] | None
    at_least: int


class BoundedEncoder:
    """The bounded encodings of one HF tokenizer; thread-safe (as its ``encode``).
    ``encode`` and ``encode_many``: the ids of a text and of each of several texts, without
    special tokens (``PromptTokenizer``'s).

    All rest on the property ``encode_prefix`` and ``kvwire.whole_encoding`` rely on: at a
    cut (a space right after a non-space), the tokenizer's pre-tokenization splits, so no
    token spans a cut, the text before a cut encodes to a prefix of the whole encoding and
    the text after it to the rest. A piece read alone from a cut may encode its first word
    otherwise than the whole does (a normalizer's ``Prepend``, Metaspace's prefix marker):
    its count is taken less that first word's own, so a count is never over-stated."""

    def __init__(self, tokenizer: Any, encode: Callable[[str], list[int]],
                 encode_many: Callable[[Sequence[str]], list[list[int]]]) -> None:
        self._tok = tokenizer
        self.encode = encode
        self.encode_many = encode_many

    def encode_within(self, text: str, max_tokens: int) -> BoundedEncoding:
        """``encode(text)`` unless ``text`` is proven to encode to more than ``max_tokens``
        tokens first, reading a bounded part of it: the memory a text far past a model's
        context costs stays about a few times the limit's, not the text's.

        Proven by its length alone when every token covers at most ``max_token_chars``
        characters (more than ``max_tokens`` times that many characters cannot fit), else
        by encoding it in pieces of at most ``3 x max_tokens`` characters from cut to cut,
        summing a lower bound of each piece's tokens, until the sum passes ``max_tokens``.
        A stretch with no cut in the reach of a piece is not encoded: it counts its
        characters over ``max_token_chars`` and, for a byte-level model, its runs of
        non-ASCII bytes over its longest token of those (``WideTokens``). A text that may
        fit is encoded whole, so its ids are exact: one without spaces (ASCII) shorter than
        ``max_tokens x max_token_chars`` characters is, at up to a token a character; one
        whose tokenizer has no ``max_token_chars`` and that is not proven by its pieces,
        whatever its length."""
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        if self._encodes_whole(text, max_tokens):
            ids = self.encode(text)
            return BoundedEncoding(ids, len(ids))
        longest = self.max_token_chars
        if longest is not None and len(text) > max_tokens * longest:
            return BoundedEncoding(None, -(-len(text) // longest))
        counted = self._count_from_start(text, max_tokens, longest)
        if counted > max_tokens:
            return BoundedEncoding(None, counted)
        ids = self.encode(text)
        return BoundedEncoding(ids, len(ids))

    def encode_many_within(self, texts: Sequence[str], max_tokens: int
                           ) -> list[BoundedEncoding]:
        """``encode_within`` of each text: those short enough to encode whole in one call
        (the library's own threads), the others one by one."""
        short = [i for i, t in enumerate(texts) if self._encodes_whole(t, max_tokens)]
        out: list[BoundedEncoding | None] = [None] * len(texts)
        for i, ids in zip(short, self.encode_many([texts[i] for i in short]), strict=True):
            out[i] = BoundedEncoding(ids, len(ids))
        return [self.encode_within(t, max_tokens) if got is None else got
                for t, got in zip(texts, out, strict=True)]

    def encode_many_in_all(self, texts: Sequence[str], max_tokens: int, max_total: int
                           ) -> list[BoundedEncoding]:
        """``encode_within`` of each text, ``max_tokens`` each and ``max_total`` in all,
        read in order and stopping at the first text whose answer has no ids or takes the
        sum of their ``at_least`` past ``max_total``: that answer is the last one given
        (fewer answers than texts, or a last one so, say a bound was passed). So the ids
        of a batch of many texts, each within ``max_tokens``, are held only up to about
        ``max_total`` tokens, not all encoded before their sum is known.

        Texts are encoded in groups of at most ``WHOLE_PIECE_CHARS`` characters (or one
        longer text) by ``encode_many_within``, each text of a group bounded by the fewer of
        ``max_tokens`` and the tokens left of ``max_total`` when the group began: a text
        proven longer than those left passes ``max_total`` with the texts before it."""
        if max_total < 0:
            raise ValueError(f"max_total must be >= 0, got {max_total}")
        out: list[BoundedEncoding] = []
        total = start = 0
        while start < len(texts):
            # [start, end): the next group, one text at least
            end, chars = start + 1, len(texts[start])
            while end < len(texts) and chars + len(texts[end]) <= WHOLE_PIECE_CHARS:
                chars += len(texts[end])
                end += 1
            for got in self.encode_many_within(texts[start:end],
                                               min(max_tokens, max_total - total)):
                out.append(got)
                total += got.at_least
                if got.ids is None or total > max_total:
                    return out
            start = end
        return out

    def encode_tail(self, text: str, keep: int) -> list[int]:
        """``encode(text)[-keep:]``, read from the text's end: the text from a cut, twice
        as long each try, until it holds ``keep`` tokens after its first word (those are
        the whole encoding's, see above); the whole text when no such cut is found."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if self._encodes_whole(text, keep):
            return self.encode(text)[-keep:]
        read = _PIECE_CHARS_PER_TOKEN * (keep + 1) + _MIN_READ_CHARS
        while read < len(text):
            cut = _next_cut(text, len(text) - read, len(text))
            if cut > 0:
                ids = self.encode(text[cut:])
                word = _next_cut(text, cut + 1, len(text))
                first = len(self.encode(text[cut:word])) if word > 0 else len(ids)
                if len(ids) - first >= keep:
                    return ids[-keep:]
            read *= 2
        return self.encode(text)[-keep:]

    def encode_whole(self, text: str, piece_chars: int = WHOLE_PIECE_CHARS) -> list[int]:
        """``encode(text)``, read from cut to cut in pieces of about ``piece_chars``
        characters where the tokenizer ``splits_at_cuts``: the same ids (those between two
        cuts are the whole encoding's, see above), while one piece's ``Encoding`` is held at
        a time, not one of the whole text. A text no longer than a piece, or any text of a
        tokenizer whose cuts are not trusted, is encoded in one call; a stretch with no cut
        in a piece's reach (no space after a word: most CJK text) is read to the next cut."""
        if len(text) <= piece_chars or not self.splits_at_cuts:
            return self.encode(text)
        ids: list[int] = []
        start = 0
        while len(text) - start > piece_chars:
            # [start, end): the text's start or a cut, to the last cut in the piece's second
            # half, else the first cut past the piece (none: the rest is read whole)
            end = space_cut(text, start + piece_chars // 2, start + piece_chars)
            if end < 0:
                end = _next_cut(text, start + piece_chars, len(text))
            if end < 0:
                break
            ids += self.encode(text[start:end])
            start = end
        ids += self.encode(text[start:])
        return ids

    @functools.cached_property
    def splits_at_cuts(self) -> bool:
        """Whether a text split at any of its cuts encodes to its whole encoding, so
        ``encode_whole`` may read it in pieces: the tokenizer has a pre-tokenizer that
        splits a sample text at each of its cuts (ByteLevel's regex, a Split regex as
        Llama 3's and Qwen's, Whitespace, Metaspace), normalizers that map each character
        alone, no added token that holds a cut or takes the whitespace beside it
        (``lstrip``, ``rstrip``), and the sample encodes so piece by piece. False for any
        other: one that does not pre-tokenize (a SentencePiece-like BPE with a ``Prepend``
        normalizer, which marks only the text's start), or one whose form cannot be read."""
        return self._form is not None and _splits_at_cuts(self._tok, self._form, self.encode)

    @functools.cached_property
    def max_token_chars(self) -> int | None:
        """The most characters of a text one token can stand for (its longest vocabulary
        entry or added token, times what its normalizer may join into one character); None
        where that has no bound: a model with an unknown token that may cover any run
        (WordPiece, Unigram, or BPE that is neither byte-level nor falls back to bytes) or
        a normalizer that may drop characters (Bert's, NMT's, Strip, a regex Replace)."""
        return None if self._form is None else _max_token_chars(self._tok, self._form)

    @functools.cached_property
    def _wide_tokens(self) -> WideTokens | None:
        """How few tokens a run of non-ASCII text takes at least (byte-level models)."""
        return None if self._form is None else WideTokens.of(self._tok, self._form)

    @functools.cached_property
    def _form(self) -> dict[str, Any] | None:
        """The tokenizer's JSON form (``to_str``: several MB for a vocabulary of 150,000),
        parsed once for ``splits_at_cuts``, ``max_token_chars`` and ``_wide_tokens``, and
        kept without its model's vocabulary and merges (what they read of the vocabulary
        comes from ``get_vocab``); None where it cannot be read."""
        return _json_form(self._tok)

    def _encodes_whole(self, text: str, max_tokens: int) -> bool:
        """Whether ``text`` is short enough to encode whole whatever it holds: at most
        ``_WHOLE_BYTES_PER_TOKEN`` UTF-8 bytes per token of the limit."""
        cap = _WHOLE_BYTES_PER_TOKEN * (max_tokens + 1) + _MIN_READ_CHARS
        if len(text) > cap:
            return False
        if text.isascii() or 4 * len(text) <= cap:
            return True
        return len(text.encode("utf-8", "surrogatepass")) <= cap

    def _count_from_start(self, text: str, max_tokens: int, longest: int | None) -> int:
        """A count of tokens ``text`` encodes to at least, read from its start in pieces
        from cut to cut until it passes ``max_tokens`` or the text ends (see
        ``encode_within``)."""
        piece = _PIECE_CHARS_PER_TOKEN * (max_tokens + 1) + _MIN_READ_CHARS
        counted = start = 0
        while start < len(text) and counted <= max_tokens:
            # [start, end): a cut (or the text's start) to the first cut past half a piece
            # (or the text's end); no token of the whole spans either
            end = _next_cut(text, start + piece // 2, len(text))
            end = len(text) if end < 0 else end
            least = -(-(end - start) // longest) if longest is not None else 0
            if end - start > piece and self._wide_tokens is not None:
                least = max(least, self._wide_tokens.at_least(text, start, end))
            if end - start <= piece:
                n = len(self.encode(text[start:end]))
                if start > 0:  # less its first word, which alone may encode otherwise
                    word = _next_cut(text, start + 1, end)
                    n -= len(self.encode(text[start:word])) if word > 0 else n
                least = max(least, n)
            counted += least
            start = end
        return counted


def _next_cut(text: str, start: int, end: int) -> int:
    """The first cut (a space right after a non-space) in ``[start, end)``, or -1."""
    found = _CUT.search(text, start, end)
    return found.start() if found else -1


def _json_form(tokenizer: Any) -> dict[str, Any] | None:
    """``BoundedEncoder._form`` of an HF tokenizer."""
    try:
        spec = json.loads(tokenizer.to_str())
    except (AttributeError, TypeError, ValueError):
        return None
    if not isinstance(spec, dict):
        return None
    model = spec.get("model")
    if isinstance(model, dict):
        spec["model"] = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
    return spec


def _splits_at_cuts(tokenizer: Any, spec: dict[str, Any],
                    encode: Callable[[str], list[int]]) -> bool:
    """``BoundedEncoder.splits_at_cuts`` of an HF tokenizer of JSON form ``spec``."""
    try:
        pre = tokenizer.pre_tokenizer
    except AttributeError:
        return False
    if pre is None:
        return False
    for node in _nodes(spec.get("normalizer")):
        pattern = node.get("pattern") or {}
        one_character = node.get("type") == "Replace" \
            and isinstance(pattern.get("String"), str) and len(pattern["String"]) == 1
        if not one_character and node.get("type") not in _PER_CHARACTER:
            return False
    for added in spec.get("added_tokens") or ():
        if added.get("lstrip") or added.get("rstrip") \
                or _CUT.search(str(added.get("content", ""))):
            return False
    sample = _CUT_SAMPLE
    cuts = [found.start() for found in _CUT.finditer(sample)]
    spans = [span for _, span in pre.pre_tokenize_str(sample)]
    if any(start < cut < end for cut in cuts for start, end in spans):
        return False
    pieces: list[int] = []
    for start, end in zip([0, *cuts], [*cuts, len(sample)], strict=True):
        pieces += encode(sample[start:end])
    return pieces == encode(sample)


def _max_token_chars(tokenizer: Any, spec: dict[str, Any]) -> int | None:
    """``BoundedEncoder.max_token_chars`` of an HF tokenizer, read off its JSON form
    ``spec``."""
    try:
        vocab = tokenizer.get_vocab(with_added_tokens=True)
    except (AttributeError, TypeError, ValueError):
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not vocab:
        return None
    # every character has a token: byte-level (its 256 bytes) or falling back to bytes
    if not model.get("byte_fallback") and "ByteLevel" not in _kinds(spec.get("pre_tokenizer")):
        return None
    shrink = 1
    for node in _nodes(spec.get("normalizer")):
        kind = node.get("type")
        pattern = node.get("pattern") or {}
        if kind == "Replace" and isinstance(pattern.get("String"), str) \
                and node.get("content"):  # a string for another: joins len(pattern) at most
            shrink *= max(1, -(-len(pattern["String"]) // len(node["content"])))
        elif kind in _NORMALIZER_SHRINK:
            shrink *= _NORMALIZER_SHRINK[kind]
        else:
            return None
    # a byte-level token's string has a character per byte: at least one per text character
    return max(len(token) for token in vocab) * shrink


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


@dataclass(frozen=True, slots=True)
class WideTokens:
    """A byte-level BPE's longest token in bytes, and its longest token of non-ASCII bytes
    alone (CJK, emoji: a few characters, where its longest token of all may be a run of a
    hundred dashes or spaces): what bounds the tokens of a text without spaces."""

    longest_bytes: int
    longest_non_ascii_bytes: int

    @staticmethod
    def of(tokenizer: Any, spec: dict[str, Any]) -> WideTokens | None:
        """Read off a tokenizer of JSON form ``spec`` with no normalizer, byte-level
        pre-tokenization and a BPE model; None for any other."""
        try:
            vocab = tokenizer.get_vocab(with_added_tokens=False)
        except (AttributeError, TypeError, ValueError):
            return None
        if spec.get("normalizer") is not None or (spec.get("model") or {}).get("type") != "BPE" \
                or "ByteLevel" not in _kinds(spec.get("pre_tokenizer")):
            return None
        byte_of = _byte_level_bytes()
        # the vocabulary spells a byte a character; an added token is plain text
        added = [str(t.get("content", "")).encode("utf-8", "surrogatepass")
                 for t in spec.get("added_tokens") or ()]
        spelt = [bytes(byte_of.get(c, 0) for c in token) for token in vocab]
        every = spelt + added
        wide = [len(b) for b in every if b and min(b) >= 0x80]
        if not every or not wide:
            return None
        return WideTokens(max(len(b) for b in every), max(wide))

    def at_least(self, text: str, start: int, end: int) -> int:
        """The tokens ``text[start:end]`` holds at least, where no token spans ``start`` or
        ``end``: each run of non-ASCII characters in it is covered by tokens of its bytes
        alone, but for the two that may reach past its ends (``longest_bytes`` of it each
        at most)."""
        least = 0
        for run in _NON_ASCII.finditer(text, start, end):
            inside = len(run.group().encode("utf-8", "surrogatepass")) - 2 * self.longest_bytes
            if inside > 0:
                least += -(-inside // self.longest_non_ascii_bytes)
        return least


@functools.cache
def _byte_level_bytes() -> dict[str, int]:
    """The byte each character of a byte-level vocabulary stands for (GPT-2's table)."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
             *range(ord("®"), ord("ÿ") + 1)]
    hidden = [b for b in range(256) if b not in shown]
    return {**{chr(b): b for b in shown}, **{chr(256 + i): b for i, b in enumerate(hidden)}}


def _nodes(node: Any) -> list[dict[str, Any]]:
    """The normalizers or pre-tokenizers of one, a ``Sequence``'s in order."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        inner = node.get("normalizers") or node.get("pretokenizers") or []
        return [leaf for child in inner for leaf in _nodes(child)]
    return [node]


def _kinds(node: Any) -> set[str]:
    return {str(leaf.get("type")) for leaf in _nodes(node)}
