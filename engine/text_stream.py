"""Incremental detokenization with stop strings.

Each push decodes a window of recent tokens, not the whole output: the tokens since the
last settled point plus the settled run before it as context (a tokenizer may render a
token differently at the start of a text, e.g. SentencePiece's leading space), and takes
the text the window adds past that context. Text is released only when it cannot change
any more: an unfinished character at the end (one U+FFFD per byte with a byte-fallback
tokenizer such as Llama-2's, one per sequence with a byte-level BPE) is held back with
every token it spans, and ``max(len(stop)) - 1`` real characters before it (a stop string
that may still be completing), until more tokens arrive or the request finishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvwire.tokenizer import PromptTokenizer

# pending tokens that may leave a character unfinished before their text is taken as it
# decodes (a UTF-8 character is at most 4 bytes; a longer run is invalid bytes, whose
# U+FFFD are final, and waiting on it would decode an ever longer window)
MAX_PENDING_TOKENS = 16
_TRIM_CHARS = 4096  # text no push reads again is dropped in pieces at least this long
_UNFINISHED = "\ufffd"


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
    are looked for only once more than that many tokens were pushed, in the text from the
    push that passes it on and the stop string's length before (as vLLM: the first
    ``min_tokens`` tokens' text alone ends nothing). The text an unfinished character
    at the end leaves when the request finishes (U+FFFD) is released by :meth:`flush`
    without a stop string search.

    Token regions of ``_ids``::

        [0, _prefix)          settled, never decoded again
        [_prefix, _read)      settled, decoded again as the window's context
        [_read, len(_ids))    pending: their text is what the window adds past the context

    Character regions of the text (absolute offsets; ``_buf`` holds ``[_dropped, _end)``)::

        [0, _emitted)         released
        [0, _settled)         the text of tokens [0, _read)
        [_settled, _end)      the pending tokens' text before their unfinished character
    """

    def __init__(self, tokenizer: Decoder, stop: Sequence[str] = (), *,
                 include_stop: bool = False, min_tokens: int = 0) -> None:
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._include = include_stop
        self._min_tokens = min_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._context_chars: int | None = 0  # len(decode(_ids[_prefix:_read])); None: unread
        self._buf = ""
        self._dropped = 0
        self._settled = 0
        self._emitted = 0
        self.stopped = False
        self.stop: str | None = None  # the stop string that ended the text

    @property
    def _end(self) -> int:
        return self._dropped + len(self._buf)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; returns the newly releasable text. Sets ``stopped`` (and drops the
        stop string and everything after it) when a stop string appears."""
        if self.stopped:
            return ""
        before = self._end
        self._ids.extend(token_ids)
        if len(self._ids) > self._read:
            self._read_window(final=False)
        if self._stop and len(self._ids) > self._min_tokens and self._find_stop(before):
            return self._release(self._end)
        return self._release(self._end - self._hold)

    def flush(self) -> str:
        """Everything not yet released (call when the request finished)."""
        if not self.stopped and len(self._ids) > self._read:
            self._read_window(final=True)
        return self._release(self._end)

    def _read_window(self, final: bool) -> None:
        """Decode tokens ``[_prefix, len(_ids))`` and put the pending tokens' text after
        the settled text: all of it, settling them, unless it ends in an unfinished
        character (and ``final`` is false, and there are not too many of them)."""
        ids = self._ids
        window = self._tok.decode(ids[self._prefix:])
        if self._context_chars is None:
            self._context_chars = len(self._tok.decode(ids[self._prefix:self._read]))
        pending = window[self._context_chars:]
        settled = self._buf[:self._settled - self._dropped]
        end = len(ids)  # tokens [_read, end) settle
        if not final and pending.endswith(_UNFINISHED):
            if end - self._read <= MAX_PENDING_TOKENS:
                self._buf = settled + pending.rstrip(_UNFINISHED)
                return
            # many tokens pushed at once, ending inside a character: those before it
            # settle, it is held with its tokens (a run of invalid bytes settles whole)
            end, pending = self._before_unfinished(pending)
        self._buf = settled + pending
        self._settled = self._end
        self._prefix, self._read, self._context_chars = self._read, end, None

    def _before_unfinished(self, pending: str) -> tuple[int, str]:
        """(``end``, the text of pending tokens ``[_read, end)``): ``end`` the last of the
        final ``MAX_PENDING_TOKENS`` token boundaries after ``_read`` where the text ends
        in no unfinished character; the whole of them (``pending``) where none does."""
        ids, context = self._ids, self._context_chars or 0
        for end in range(len(ids) - 1, max(self._read, len(ids) - MAX_PENDING_TOKENS), -1):
            text = self._tok.decode(ids[self._prefix:end])
            if not text.endswith(_UNFINISHED):
                return end, text[context:]
        return len(ids), pending

    def _find_stop(self, new: int) -> bool:
        """Look for the stop strings that end past ``new`` (each from its own length
        before it: a search costs their length and the new text, however long the longest
        one); at the first, cut the text there (after it with ``include_stop``) and stop."""
        at = new + 1 - self._dropped
        buf = self._buf
        found = [(i, s) for s in self._stop if (i := buf.find(s, max(0, at - len(s)))) >= 0]
        if not found:
            return False
        cut, stop = min(found)
        self.stopped, self.stop = True, stop
        self._buf = buf[:cut + len(stop) if self._include else cut]
        return True

    def _release(self, end: int) -> str:
        out = ""
        if end > self._emitted:
            out = self._buf[self._emitted - self._dropped : end - self._dropped]
            self._emitted = end
        # what no later push reads: released, settled, and before the stop search's start
        keep_from = min(self._emitted, self._settled, self._end - self._hold)
        if keep_from - self._dropped >= _TRIM_CHARS:
            self._buf = self._buf[keep_from - self._dropped:]
            self._dropped = keep_from
        return out
