"""Incremental detokenization with stop strings.

Text is released only when it cannot change any more: a trailing U+FFFD (an unfinished
UTF-8 sequence) and the last ``max(len(stop)) - 1`` characters (a stop string that may
still be completing) are held back until more tokens arrive or the request finishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvwire.tokenizer import PromptTokenizer


class Decoder(Protocol):
    def decode(self, ids: Sequence[int]) -> str: ...


class SpecialKeeping:
    """``tokenizer``'s decoding with special tokens' text kept (SGLang's
    ``skip_special_tokens: false``; its own ``decode`` leaves them out)."""

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self._tok = tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


class TextStream:
    """``include_stop``: the stop string stays in the text; ``min_tokens``: stop strings
    are looked for only once that many tokens were pushed (in the text from the push that
    reaches it on, and the stop string's length before)."""

    def __init__(self, tokenizer: Decoder, stop: Sequence[str] = (), *,
                 include_stop: bool = False, min_tokens: int = 0) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._include = include_stop
        self._min_tokens = min_tokens
        self._ids: list[int] = []
        self._text = ""
        self._emitted = 0
        self.stopped = False
        self.stop: str | None = None  # the stop string that ended the text

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; returns the newly releasable text. Sets ``stopped`` (and drops the
        stop string and everything after it) when a stop string appears."""
        if self.stopped:
            return ""
        before = len(self._text)
        self._ids.extend(token_ids)
        text = self._tok.decode(self._ids)
        if self._stop and len(self._ids) >= self._min_tokens:
            lo = max(0, self._emitted - self._hold)
            if len(self._ids) - len(token_ids) < self._min_tokens:
                lo = max(lo, before - self._hold)  # text before min_tokens is not searched
            found = [(i, s) for s in self._stop if (i := text.find(s, lo)) >= 0]
            if found:
                cut, stop = min(found)
                self.stopped, self.stop = True, stop
                self._text = text[:cut + len(stop) if self._include else cut]
                return self._release(len(self._text))
        self._text = text
        end = len(text) - self._hold
        if text.endswith("\ufffd"):
            end = min(end, len(text) - 1)
        return self._release(end)

    def flush(self) -> str:
        """Everything not yet released (call when the request finished)."""
        return self._release(len(self._text))

    @property
    def text(self) -> str:
        return self._text

    def _release(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        out = self._text[self._emitted : end]
        self._emitted = end
        return out
