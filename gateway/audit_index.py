"""The earlier requests of one model and tenant, indexed for the prompt-layout audit to
find, for a new request, the few worth comparing it with:

- its conversation's previous turn (same first user message, fewer messages, and its last
  message repeated at the same place);
- the earlier prompt sharing the longest text prefix (its neighbour in sorted order):
  what a prefix cache could give it now;
- the earlier prompts sharing the most of its content further in (anchors: hashes of a few
  words, taken where the text itself says so, so they survive a shift): a timestamp at the
  start makes every prompt's prefix short, but the one with the same document after it is
  the one that should have shared;
- the latest one.
"""

from __future__ import annotations

import bisect
import zlib
from array import array
from collections import Counter
from dataclasses import dataclass, field

from gateway.layout_causes import Turns, common_prefix_chars

_ANCHOR_SCAN_CHARS = 16384  # anchors are taken from the start of a prompt ...
_MAX_ANCHORS = 64  # ... at most this many ...
_ANCHOR_WORDS = 6  # ... each a hash of this many words, starting at a word whose hash
_ANCHOR_EVERY = 8  # is 0 modulo this
_PER_ANCHOR = 8  # requests remembered per anchor (the latest)


@dataclass(slots=True)
class AuditPrompt:
    index: int  # in the audit's requests
    text: str
    ids: list[int]
    ends: array[int]  # ends[i]: the character offset where token i's text ends
    messages: list[dict[str, str]] | None

    def tokens_within(self, chars: int) -> int:
        """How many of its tokens lie wholly in ``text[:chars]``."""
        return bisect.bisect_right(self.ends, chars)


def _first_user(messages: list[dict[str, str]] | None) -> str | None:
    return next((m["content"] for m in messages or () if m["role"] == "user"), None)


def _anchors(text: str) -> set[int]:
    words = text[:_ANCHOR_SCAN_CHARS].split()
    found: set[int] = set()
    for i in range(len(words) - _ANCHOR_WORDS):  # crc32: the same anchors in every process
        if zlib.crc32(words[i].encode()) % _ANCHOR_EVERY == 0:
            found.add(zlib.crc32(" ".join(words[i: i + _ANCHOR_WORDS]).encode()))
            if len(found) >= _MAX_ANCHORS:
                break
    return found


@dataclass(slots=True)
class AuditGroup:
    prompts: list[AuditPrompt] = field(default_factory=list)
    _by_text: list[tuple[str, int]] = field(default_factory=list)  # sorted
    _turns: dict[str, int] = field(default_factory=dict)  # first user message -> latest
    _anchored: dict[int, list[int]] = field(default_factory=dict)  # anchor -> latest

    def add(self, prompt: AuditPrompt) -> None:
        at = len(self.prompts)
        self.prompts.append(prompt)
        bisect.insort(self._by_text, (prompt.text, at))
        key = _first_user(prompt.messages)
        if key is not None:
            self._turns[key] = at
        for anchor in _anchors(prompt.text):
            held = self._anchored.setdefault(anchor, [])
            held.append(at)
            if len(held) > _PER_ANCHOR:
                del held[0]

    def candidates(self, b: AuditPrompt, count: int) -> list[tuple[AuditPrompt, Turns | None]]:
        """Up to ``count`` earlier prompts to compare ``b`` with, in the module's order."""
        found: list[tuple[AuditPrompt, Turns | None]] = []
        seen: set[int] = set()
        key = _first_user(b.messages)
        prev_at = self._turns.get(key) if key is not None else None
        if prev_at is not None and b.messages is not None:
            prev = self.prompts[prev_at]
            am = prev.messages or []
            if am and len(am) < len(b.messages) and b.messages[len(am) - 1] == am[-1]:
                found.append((prev, Turns(am, b.messages)))
                seen.add(prev_at)
        at = bisect.bisect_left(self._by_text, (b.text, -1))
        near = [self._by_text[i] for i in (at - 1, at) if 0 <= i < len(self._by_text)]
        near.sort(key=lambda item: -common_prefix_chars(item[0], b.text))
        shared = Counter(i for anchor in _anchors(b.text)
                         for i in self._anchored.get(anchor, ()))
        ranked = sorted(shared, key=lambda i: (-shared[i], -i))
        order = [n[1] for n in near[:1]] + ranked[:2] + [len(self.prompts) - 1]
        for i in order:
            if len(found) >= count:
                break
            if i not in seen:
                seen.add(i)
                found.append((self.prompts[i], None))
        return found
