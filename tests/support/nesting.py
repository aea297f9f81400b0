"""Deeply nested values, as a hostile client sends them."""

from __future__ import annotations

from typing import Any


def nested(depth: int, inner: Any = None) -> Any:
    """``inner`` (an empty list when None) inside ``depth`` lists."""
    value: Any = [] if inner is None else inner
    for _ in range(depth):
        value = [value]
    return value
