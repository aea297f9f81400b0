"""A bounded, thread-safe memo: at most ``capacity`` entries (and, with ``weight``, at most
``max_weight`` of their weights in all), the least recently used go first. Shared by the
tokenizer pool's threads (prefix encodings, chat-head anchors, prompt pieces' hashes)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")
_NONE = object()


class BoundedMemo(Generic[K, V]):
    __slots__ = ("_entries", "_lock", "_weight", "capacity", "max_weight", "weight")

    def __init__(self, capacity: int, weight: Callable[[V], int] | None = None,
                 max_weight: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        if (weight is None) != (max_weight is None):
            raise ValueError("weight and max_weight go together")
        if max_weight is not None and max_weight < 1:
            raise ValueError(f"max_weight must be >= 1, got {max_weight!r}")
        self.capacity = capacity
        self.max_weight = max_weight
        self._weight = weight
        self.weight = 0  # of the entries kept (0 without ``weight``)
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K, default: D) -> V | D:
        """The value remembered for ``key`` (now the most recently used), else ``default``."""
        with self._lock:
            if key not in self._entries:
                return default
            self._entries.move_to_end(key)
            return self._entries[key]

    def put(self, key: K, value: V) -> None:
        weigh = self._weight
        with self._lock:
            entries = self._entries
            if weigh is not None:
                old = entries.get(key, _NONE)
                if old is not _NONE:
                    self.weight -= weigh(old)  # type: ignore[arg-type]
                self.weight += weigh(value)
            entries[key] = value
            entries.move_to_end(key)
            while len(entries) > self.capacity or (
                    self.max_weight is not None and self.weight > self.max_weight):
                _, dropped = entries.popitem(last=False)
                if weigh is not None:
                    self.weight -= weigh(dropped)

    def pop(self, key: K, default: D) -> V | D:
        """Forget ``key``: the value it had, else ``default``."""
        with self._lock:
            value = self._entries.pop(key, _NONE)
            if value is _NONE:
                return default
            if self._weight is not None:
                self.weight -= self._weight(value)  # type: ignore[arg-type]
            return value  # type: ignore[return-value]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.weight = 0

    def items(self) -> list[tuple[K, V]]:
        """The entries remembered, the least recently used first."""
        with self._lock:
            return list(self._entries.items())

    def values(self) -> list[V]:
        """The values remembered, the least recently used first."""
        with self._lock:
            return list(self._entries.values())
