"""What a policy derived from one request, kept for the next call about the same request.

A routed request is seen twice in a row: ``choose`` derives its key (hashes, a window),
then ``observe(Routed)`` needs the same. ``RequestMemo`` keeps the last request's by
identity, so the second call reads it instead of deriving it again. It is a cache of a
pure function of the request and the policy's state at ``choose``, not routing state:
the policy clears it wherever that state changes (``prefix_affinity`` and ``cost`` change
it only in ``observe(Routed)``, which reads the value and then clears it).
"""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class RequestMemo(Generic[T]):
    """The value derived for the last request ``put`` (held by identity)."""

    __slots__ = ("_request", "_value")

    def __init__(self) -> None:
        self._request: object | None = None
        self._value: T | None = None

    def get(self, request: object) -> T | None:
        """The value put for this very request object, else None."""
        return self._value if self._request is request else None

    def put(self, request: object, value: T) -> T:
        self._request, self._value = request, value
        return value

    def clear(self) -> None:
        self._request = self._value = None
