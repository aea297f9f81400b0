"""What a policy learns from its traffic counts a request once, however many replicas it
was tried on (``CountedRequests``).

A request is tried again on another replica after its try was refused (``Unrouted``,
then ``Routed``) or after a try that may have reached its replica (timed out, broke after
being sent: a second ``Routed`` with no ``Unrouted`` between). Either way the later
``Routed`` is the same request again: a policy counts what it says of the traffic (a
prefix's count, request rates, a learner's samples) at its first try alone, and what the
tries made it believe of each replica's cache per try.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from policies.base import RouteRequest

# requests counted whose end is still to come, kept: at least the requests in flight (a
# retry after a timeout comes as late as the timeout, with every request routed meanwhile
# counted between); a request whose end is never told goes once this many newer ones push
# it out, and its retry, if one still comes, counts again
_COUNTED_KEPT = 1 << 14
_Kept = TypeVar("_Kept")


class CountedRequests(Generic[_Kept]):
    """The requests a policy counted at their first ``Routed``, with what it keeps of that
    count for each (a ``_Kept``), until their end (``ended``: ``Finished``): a ``Routed``
    of one of them is a retry.

    Only a try whose caller tells its end (``Routed.revocable``) is noted: a route another
    gateway copy or worker process made is told once, with no end to come (its later
    tries come as new objects, marked ``Routed.again``). Each request is
    held by identity: the object itself is kept, so another request can never take its
    ``id``. A count-min sketch's conservative update or a learner's window cannot be taken
    back exactly, so a retry must be known as one when its ``Routed`` comes, not undone
    afterwards."""

    __slots__ = ("_counted",)

    def __init__(self) -> None:
        # by ``id``: (the request, what was kept for it), oldest first
        self._counted: dict[int, tuple[RouteRequest, _Kept]] = {}

    def retried(self, request: RouteRequest) -> _Kept | None:
        """For a ``Routed`` of ``request``: what was kept at its first try when this is a
        retry of it (the request stays counted, for its next retry), else None."""
        entry = self._counted.get(id(request))  # (the usual case: a miss, and nothing more)
        return entry[1] if entry is not None and entry[0] is request else None

    def counted(self, request: RouteRequest, kept: _Kept) -> None:
        """``request``'s first try was counted: its tries until its end are retries,
        handed ``kept``."""
        counted = self._counted
        counted[id(request)] = (request, kept)
        if len(counted) > _COUNTED_KEPT:
            del counted[next(iter(counted))]

    def ended(self, request: RouteRequest) -> None:
        """``request`` ended (``Finished``): no retry of it is to come. (One kept under its
        ``id`` is itself: the kept request lives, and two live objects never share one.)"""
        self._counted.pop(id(request), None)

    def __len__(self) -> int:
        return len(self._counted)
