"""Whether rendered prompts share their stable prefix, judged in token ids.

A prefix cache matches token ids, block by block, from the first token on: one changed
token early in a prompt (a timestamp, a request id) makes everything after it a miss, and
equal text can still tokenize differently where the stable part meets what follows. So the
check fingerprints token ids, not characters:

- ``prefix_fingerprint(prompt, tokenizer, n_tokens)``: a SHA-256 of the first ``n_tokens``
  token ids (u32 little-endian), equal for prompts whose first ``n_tokens`` tokens are.
- ``assert_shared_prefix(render_a, render_b, tokenizer, n_tokens)``: raises
  ``SharedPrefixError`` (an ``AssertionError``, so pytest shows it) naming the first token
  where two rendered prompts differ and the text around it.
- ``common_prefix_tokens(ids_a, ids_b)``: how many leading token ids two prompts share.

``tokenizer`` is the project's ``PromptTokenizer``, an HF ``tokenizers.Tokenizer``, a
``transformers`` tokenizer (anything whose ``encode(text, add_special_tokens=False)`` gives
ids or an object with ``.ids``), a path to a ``tokenizer.json`` or its directory, or None
for the project's own tokenizer.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from kvwire.tokenizer import PromptTokenizer, load_tokenizer

ADVICE = ("Keep what varies per request (timestamps, request ids, retrieved text, the user's "
          "message) after the stable part; end the stable part on a newline, so its last "
          "token cannot merge with what follows; and fingerprint token ids, not characters: "
          "equal text can tokenize differently where two parts meet.")
_CONTEXT_TOKENS = 24  # tokens decoded on each side of the first difference ...
_CONTEXT_CHARS = 48  # ... and the characters of them shown


class TokenCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class SharedPrefixError(AssertionError):
    """Two rendered prompts differ within the prefix that should be shared."""


class _Foreign:
    """An HF ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer, without special
    tokens (a BOS token would be the same in every prompt and tell nothing)."""

    __slots__ = ("_tok",)

    def __init__(self, tok: Any) -> None:
        self._tok = tok

    def encode(self, text: str) -> list[int]:
        out = self._tok.encode(text, add_special_tokens=False)
        return list(out.ids if hasattr(out, "ids") else out)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids)))


def codec_of(tokenizer: Any) -> TokenCodec:
    """``tokenizer`` as something that encodes and decodes (see the module's docstring)."""
    if tokenizer is None or isinstance(tokenizer, str | Path):
        return load_tokenizer(tokenizer)
    if isinstance(tokenizer, PromptTokenizer):
        return tokenizer
    if callable(getattr(tokenizer, "encode", None)) and callable(
            getattr(tokenizer, "decode", None)):
        return _Foreign(tokenizer)
    raise TypeError(f"tokenizer must be a tokenizer, a path or None, got "
                    f"{type(tokenizer).__name__}")


def _check_n(n_tokens: int) -> None:
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 1:
        raise ValueError(f"n_tokens must be an integer >= 1, got {n_tokens!r}")


def ids_digest(ids: Sequence[int]) -> str:
    """SHA-256 (hex) of token ids as u32 little-endian."""
    packed = array("I", ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return hashlib.sha256(packed.tobytes()).hexdigest()


def prefix_fingerprint(prompt: str, tokenizer: Any, n_tokens: int) -> str:
    """The fingerprint of ``prompt``'s first ``n_tokens`` token ids; ``ValueError`` when it
    has fewer (a shorter prompt shares no ``n_tokens`` prefix with anything)."""
    _check_n(n_tokens)
    ids = codec_of(tokenizer).encode(prompt)
    if len(ids) < n_tokens:
        raise ValueError(f"the prompt has {len(ids)} tokens, fewer than n_tokens={n_tokens}")
    return ids_digest(ids[:n_tokens])


def common_prefix_tokens(ids_a: Sequence[int], ids_b: Sequence[int]) -> int:
    """The number of leading token ids ``ids_a`` and ``ids_b`` share (a bisection over
    slice comparisons: C speed on long prompts)."""
    a, b = array("I", ids_a).tobytes(), array("I", ids_b).tobytes()
    lo, hi = 0, min(len(ids_a), len(ids_b))  # invariant: [0, lo) agree; the answer <= hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo * 4: mid * 4] == b[lo * 4: mid * 4]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _around(codec: TokenCodec, ids: Sequence[int], at: int) -> str:
    """The text of the tokens around ``ids[at]``, that token in ``[[ ]]``."""
    before = codec.decode(ids[max(0, at - _CONTEXT_TOKENS): at])[-_CONTEXT_CHARS:]
    token = codec.decode(ids[at: at + 1]) if at < len(ids) else "<end of prompt>"
    after = codec.decode(ids[at + 1: at + 1 + _CONTEXT_TOKENS])[:_CONTEXT_CHARS]
    return f"{before!r}[[{token!r}]]{after!r}"


def assert_shared_prefix(render_a: str, render_b: str, tokenizer: Any, n_tokens: int) -> str:
    """Pass when the two rendered prompts' first ``n_tokens`` token ids are equal (and
    return their fingerprint); else raise ``SharedPrefixError`` naming the first token where
    they differ, the text around it in each, and what to do about it."""
    _check_n(n_tokens)
    codec = codec_of(tokenizer)
    ids_a, ids_b = codec.encode(render_a), codec.encode(render_b)
    shared = common_prefix_tokens(ids_a[:n_tokens], ids_b[:n_tokens])
    if shared == n_tokens:
        return ids_digest(ids_a[:n_tokens])
    if shared == min(len(ids_a), len(ids_b)):
        short = "a" if len(ids_a) < len(ids_b) else "b"
        raise SharedPrefixError(
            f"prompt {short} has only {shared} tokens, fewer than n_tokens={n_tokens}, and "
            f"the other starts with the same {shared}: render a longer stable part or "
            f"lower n_tokens.\n{ADVICE}")

    def token_id(ids: list[int]) -> str:
        return str(ids[shared]) if shared < len(ids) else "none"

    raise SharedPrefixError(
        f"the prompts differ at token {shared} of the first {n_tokens} (token ids "
        f"{token_id(ids_a)} vs {token_id(ids_b)}); a cache reuses only the {shared} tokens "
        f"before it.\n"
        f"  a: {_around(codec, ids_a, shared)}\n"
        f"  b: {_around(codec, ids_b, shared)}\n"
        f"{ADVICE}")
