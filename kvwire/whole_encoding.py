"""Whole-prompt encodings that reuse a remembered prefix (a document, a chat's earlier turns).

A policy that matches a prompt's blocks against the engines' (``kv_events``, ``cost`` with
KV events) needs every token of every prompt: about 3 ms of CPU for a 1,500-word one. Most
of a prompt repeats an earlier one, so its encoding is remembered at *cuts* and only the
rest is encoded::

    mark_k = k x MARK characters                      k = 1, 2, ... (up to MAX_CHARS)
    cut_k  = the last space after a non-space in [mark_k - MARK, mark_k)  (``space_cut``;
             a cut depends on text[:mark_k] only)
    encode(text) = remembered ids of text[:cut] + encode(text[cut:])   (the longest cut held)

The same property ``encode_prefix`` relies on makes this exact: a byte-level pre-tokenizer
never joins the characters on both sides of a position right before a space that follows
a non-space, so the text before a cut encodes to a prefix of the whole encoding and the
text from it to the rest. A text with no such position is encoded whole.
The first ``CHECKS`` split encodings are checked against a whole encoding; one that
differs (a tokenizer without that property) turns reuse off for good, so a wrong split can
cost only those few encodings.

On a miss the text is encoded in two parts, split at its second last cut, which is at
least ``MARK`` characters before the end, so it lies in the part the next prompt likely
shares (its document, its earlier turns); the first part's ids are remembered. Entries are
keyed by the group (a tenant's cache salt), the cut and a hash of the text before it, and
hold a u32 array: at most ``capacity`` arrays of ``MAX_CHARS`` characters' tokens.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections.abc import Callable

from kvwire.bounded_memo import BoundedMemo

MARK = 1024  # characters between cuts
MAX_CHARS = 32_768  # no cut past this many characters
CHECKS = 8  # reuses checked against a whole encoding before reuse is trusted

log = logging.getLogger(__name__)

Encode = Callable[[str], list[int]]


def space_cut(text: str, start: int, end: int) -> int:
    """The last position in ``[start, end)`` that holds a space after a character that is
    not whitespace, or -1: the text splits there as it encodes whole. (Before a space
    that follows whitespace, a run of spaces or ``"  \n"``, byte-level tokenizers with
    merged whitespace tokens join both sides.)"""
    cut = text.rfind(" ", start, end)
    while cut > 0 and text[cut - 1].isspace():  # the one before it may qualify
        cut = text.rfind(" ", start, cut)
    return cut if cut > 0 else -1


def cuts(text: str) -> list[int]:
    """The text's cut positions, ascending (see the module docstring); none for a text
    with no space after a word in any of its ``MARK``-character windows (most CJK text)."""
    out: list[int] = []
    for mark in range(MARK, min(len(text), MAX_CHARS) + 1, MARK):
        cut = space_cut(text, mark - MARK, mark)
        if cut > 0 and (not out or cut > out[-1]):
            out.append(cut)
    return out


class WholeEncodings:
    """Whole encodings through remembered prefixes; thread-safe (the tokenizer pool)."""

    def __init__(self, encode: Encode, capacity: int = 1024) -> None:
        self._encode = encode
        self._memo: BoundedMemo[tuple[str, int, int], array[int]] = BoundedMemo(capacity)
        self._lock = threading.Lock()
        self.checked = 0
        self.reuse = True
        self.hits = 0

    def encode(self, text: str, group: str = "") -> list[int]:
        """``encode(text)``, reusing the longest remembered prefix of it."""
        if not self.reuse or len(text) < 2 * MARK:
            return self._encode(text)
        keys = [(group, cut, hash(text[:cut])) for cut in cuts(text)]
        if not keys:
            return self._encode(text)
        for key in reversed(keys):
            held = self._memo.get(key, None)
            if held is not None:
                with self._lock:
                    self.hits += 1
                return self._joined(text, key[1], held.tolist())
        # a miss: encoded in two parts (as fast as in one), the first remembered
        key = keys[-2] if len(keys) > 1 else keys[-1]
        head = self._encode(text[: key[1]])
        self._memo.put(key, array("I", head))
        return self._joined(text, key[1], head)

    def _joined(self, text: str, cut: int, head: list[int]) -> list[int]:
        ids = head + self._encode(text[cut:])
        with self._lock:
            check = self.reuse and self.checked < CHECKS
            if check:
                self.checked += 1
        if check:
            whole = self._encode(text)
            if whole != ids:
                with self._lock:
                    self.reuse = False
                log.warning("this tokenizer encodes a text split before a space otherwise "
                            "than whole; whole prompts are encoded in full from now on")
                return whole
        return ids
