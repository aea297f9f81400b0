"""An HF tokenizer that notes the characters of every text it is asked to encode: what the
tests of bounded encodings read to show a long text was never handed over whole."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import Tokenizer


class RecordingTokenizer:
    """``inner`` noting in ``given`` the length of each text it encodes. ``hide_form``: it
    hides its JSON form (``to_str``), so the longest token it may give is unknown (as a
    WordPiece's) and a long text can be refused only by encoding pieces."""

    def __init__(self, inner: Tokenizer, hide_form: bool = False) -> None:
        self.inner = inner
        self.hide_form = hide_form
        self.given: list[int] = []

    def __getattr__(self, name: str) -> Any:
        if name == "to_str" and self.hide_form:
            raise AttributeError(name)
        return getattr(self.inner, name)

    def encode(self, text: str, **kw: Any) -> Any:
        self.given.append(len(text))
        return self.inner.encode(text, **kw)

    def encode_batch(self, texts: Sequence[str], **kw: Any) -> Any:
        self.given.extend(len(t) for t in texts)
        return self.inner.encode_batch(texts, **kw)

    def encode_batch_fast(self, texts: Sequence[str], **kw: Any) -> Any:
        self.given.extend(len(t) for t in texts)
        return self.inner.encode_batch_fast(texts, **kw)
