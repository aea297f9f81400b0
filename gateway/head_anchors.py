"""The anchors of chat heads, remembered: a conversation's later turns repeat its head.

A chat's head (its tools and messages up to the first user message) is encoded on every
turn for its token count, the anchor ``prefix_affinity`` keys a conversation by. Every later
turn of that conversation carries the same head, so its anchor is remembered by the head's
digest (and the tenant's cache salt, and the tokens asked for): a later turn hashes the
head (microseconds) instead of encoding it (a millisecond or more for ~2,000 tokens). A
turn also gets the anchor its conversation's first turn got, whatever the encoder has
learned about read lengths since.

Bounded (least recently used entries go first); safe to share between the tokenizer
pool's threads.
"""

from __future__ import annotations

from collections.abc import Callable
from hashlib import blake2b

from kvwire.bounded_memo import BoundedMemo

_UNKNOWN = object()


class HeadAnchors:
    """``anchor(head, needed, group, compute)``: ``compute()`` the first time, remembered."""

    __slots__ = ("_memo", "hits")

    def __init__(self, capacity: int = 4096) -> None:
        self._memo: BoundedMemo[tuple[str, int | None, bytes], int | None] = \
            BoundedMemo(capacity)
        self.hits = 0  # answers from the memo (races between threads may drop a count)

    def __len__(self) -> int:
        return len(self._memo)

    def anchor(self, head: str, needed: int | None, group: str,
               compute: Callable[[], int | None]) -> int | None:
        digest = blake2b(head.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        key = (group, needed, digest)
        found = self._memo.get(key, _UNKNOWN)
        if found is not _UNKNOWN:
            self.hits += 1
            return found  # type: ignore[return-value]
        value = compute()  # not under the memo's lock: encoding takes milliseconds
        self._memo.put(key, value)
        return value
