"""Why two prompts that should share a prefix part ways, and the edit that would undo it.

Given an earlier prompt ``a``, a later one ``b`` and ``at``, the first character where
their texts differ (``a[:at] == b[:at]``), ``find_fix`` names the cause and returns a
``Fix``: the span of ``b`` to replace with ``a``'s text so the two agree past ``at``. The
audit applies fixes one after another and measures, in tokens, how much longer the
shared prefix gets. Causes, tried in this order (most specific first):

- ``uuid``: a UUID, a long hex string or an id of letters and digits covers ``at``;
- ``timestamp``: a date, a time or a Unix time covers ``at``;
- ``json_key_order``: a JSON object around ``at`` parses to the same value in both, but
  its keys are written in another order;
- ``history_rewrite``: ``a`` is the previous turn of ``b``'s conversation, and an earlier
  message changed between the two turns;
- ``chunk_order``: from the line where they part, the same chunks (paragraphs, else
  lines) follow in another order;
- ``other``: a short stretch differs, then the texts agree again.

A volatile value (``moves_out``) would leave the shared part in a fix (moved after it), so
its own tokens are not counted as saved; reordered JSON or chunks and a rewritten turn would
be shared as they are.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

CAUSES = ("timestamp", "uuid", "json_key_order", "chunk_order", "history_rewrite", "other")

_WINDOW = 96  # characters searched on each side of ``at`` for a timestamp or an id
_JSON_BACK_CHARS = 16384  # how far back an enclosing JSON object may start ...
_JSON_TRIES = 32  # ... and how many opening braces are tried
_MAX_CHUNKS = 256
_CHUNK_SCAN_CHARS = 1 << 17
_BRIEF_CHARS = 240  # a stretch "differs briefly" when it is at most this long ...
_AGAIN_CHARS = 24  # ... and the texts then agree for at least this many characters

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
_ZONE = r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}))?"
_TIMESTAMP = re.compile(
    rf"\d{{4}}-\d{{2}}-\d{{2}}(?:[T ]\d{{1,2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d+)?)?)?{_ZONE}"
    rf"|\d{{1,2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d+)?)?(?:\s?[AaPp][Mm])?{_ZONE}"
    rf"|{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}"
    rf"|\d{{1,2}}\s+{_MONTH}\s+\d{{4}}"
    r"|\d{1,2}/\d{1,2}/\d{2,4}"
    r"|\b1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?\b")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                   r"[0-9a-fA-F]{12}|\b[0-9a-fA-F]{16,}\b")
_ID = re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{12,}\b")


@dataclass(frozen=True, slots=True)
class Fix:
    """Replace ``b[start:end]`` with ``replacement`` (``a``'s text there)."""

    cause: str
    start: int
    end: int
    replacement: str
    moves_out: bool

    def apply(self, b: str) -> str:
        return b[: self.start] + self.replacement + b[self.end:]


@dataclass(frozen=True, slots=True)
class Turns:
    """``a``'s and ``b``'s chat messages when ``a`` is the previous turn of ``b``'s
    conversation (its last message reappears at the same index in ``b``)."""

    a: Sequence[Mapping[str, str]]
    b: Sequence[Mapping[str, str]]


def _covering(pattern: re.Pattern[str], text: str, at: int) -> tuple[int, int] | None:
    lo = max(0, at - _WINDOW)
    for m in pattern.finditer(text, lo, at + _WINDOW):
        if m.start() <= at <= m.end() and m.end() > m.start():
            return m.start(), m.end()
    return None


def _value_span(pattern: re.Pattern[str], cause: str) -> Callable[..., Fix | None]:
    def detect(a: str, b: str, at: int, turns: Turns | None) -> Fix | None:
        in_a, in_b = _covering(pattern, a, at), _covering(pattern, b, at)
        if in_a is None or in_b is None:
            return None
        return Fix(cause, in_b[0], in_b[1], a[in_a[0]: in_a[1]], moves_out=True)
    return detect


def _json_key_order(a: str, b: str, at: int, turns: Turns | None) -> Fix | None:
    """The outermost JSON object around ``at`` that is equal in both by value."""
    decoder = json.JSONDecoder()
    found: Fix | None = None
    lo, end = max(0, at - _JSON_BACK_CHARS), at
    for _ in range(_JSON_TRIES):
        start = b.rfind("{", lo, end)
        if start < 0:
            break
        end = start
        try:
            value_a, end_a = decoder.raw_decode(a, start)
            value_b, end_b = decoder.raw_decode(b, start)
        except json.JSONDecodeError:
            continue
        if end_a <= at or end_b <= at:
            continue  # an object that closes before the difference
        if value_a != value_b:
            break  # this one and every object around it differ in content
        found = Fix("json_key_order", start, end_b, a[start:end_a], moves_out=False)
    return found


def _history_rewrite(a: str, b: str, at: int, turns: Turns | None) -> Fix | None:
    if turns is None:
        return None
    for k in range(len(turns.a) - 1):
        old, new = turns.a[k], turns.b[k]
        if old == new:
            continue
        content = new.get("content", "")
        start = b.find(content, max(0, at - len(content)), at + len(content) + 1)
        if start < 0 or start > at:
            return None
        return Fix("history_rewrite", start, start + len(content), old.get("content", ""),
                   moves_out=False)
    return None


def _chunk_order(a: str, b: str, at: int, turns: Turns | None) -> Fix | None:
    for sep in ("\n\n", "\n"):
        cut = b.rfind(sep, 0, at)
        start = 0 if cut < 0 else cut + len(sep)
        chunks_a = a[start: start + _CHUNK_SCAN_CHARS].split(sep, _MAX_CHUNKS)[:-1]
        chunks_b = b[start: start + _CHUNK_SCAN_CHARS].split(sep, _MAX_CHUNKS)[:-1]
        balance: Counter[str] = Counter()
        best = 0
        # [0, k) of each: the same chunks when ``balance`` is all zero
        for k, (ca, cb) in enumerate(zip(chunks_a, chunks_b, strict=False), start=1):
            balance[ca] += 1
            balance[cb] -= 1
            if not balance[ca]:
                del balance[ca]
            if cb in balance and not balance[cb]:
                del balance[cb]
            if not balance and k >= 2:
                best = k
        if best:
            old = sep.join(chunks_a[:best])
            return Fix("chunk_order", start, start + len(sep.join(chunks_b[:best])), old,
                       moves_out=False)
    return None


def _brief(a: str, b: str, at: int, turns: Turns | None) -> Fix | None:
    """A stretch of at most ``_BRIEF_CHARS`` in each, then ``_AGAIN_CHARS`` that agree."""
    for j in range(min(_BRIEF_CHARS, len(b) - at - _AGAIN_CHARS) + 1):
        again = b[at + j: at + j + _AGAIN_CHARS]
        i = a.find(again, at, at + _BRIEF_CHARS + _AGAIN_CHARS)
        if i >= 0:
            return Fix("other", at, at + j, a[at:i], moves_out=True)
    return None


_DETECTORS: tuple[Callable[[str, str, int, Turns | None], Fix | None], ...] = (
    _value_span(_UUID, "uuid"), _value_span(_TIMESTAMP, "timestamp"),
    _value_span(_ID, "uuid"), _json_key_order, _history_rewrite, _chunk_order, _brief)


def find_fix(a: str, b: str, at: int, turns: Turns | None = None) -> Fix | None:
    """The first cause (in the module's order) that explains the difference at ``at``."""
    for detect in _DETECTORS:
        fix = detect(a, b, at, turns)
        if fix is not None and fix.apply(b) != b:
            return fix
    return None


def common_prefix_chars(a: str, b: str) -> int:
    """How many leading characters ``a`` and ``b`` share (bisection over slices)."""
    lo, hi = 0, min(len(a), len(b))  # [0, lo) agree; the answer <= hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
