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

import threading
from collections import OrderedDict
from collections.abc import Callable
from hashlib import blake2b

_Key = tuple[str, int | None, int, bytes]


class HeadAnchors:
    """``anchor(head, needed, group, compute)``: ``compute()`` the first time, remembered."""

    __slots__ = ("_lock", "_memo", "capacity", "hits")

    def __init__(self, capacity: int = 4096) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.capacity = capacity
        self.hits = 0
        self._memo: OrderedDict[_Key, int | None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._memo)

    def anchor(self, head: str, needed: int | None, group: str,
               compute: Callable[[], int | None]) -> int | None:
        digest = blake2b(head.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        key = (group, needed, len(head), digest)
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                self.hits += 1
                return self._memo[key]
        value = compute()  # outside the lock: encoding takes milliseconds
        with self._lock:
            self._memo[key] = value
            self._memo.move_to_end(key)
            while len(self._memo) > self.capacity:
                self._memo.popitem(last=False)
        return value
