"""What a policy learns from its traffic counts a request once, however many replicas it
was tried on (``RefusedTries``)."""

from __future__ import annotations

from typing import Generic, TypeVar

from policies.base import RouteRequest

# requests refused whose retry is still to come, kept: the gateway sends the retry as soon
# as the refusal comes (no other request's route between), and a request refused by its
# last replica, never retried, goes at its end (``Finished``); one whose end is not told
# goes once this many newer ones push it out
_REFUSED_KEPT = 16
_Kept = TypeVar("_Kept")


class RefusedTries(Generic[_Kept]):
    """The requests whose last try its replica refused (``Unrouted``), until their next
    ``Routed`` or their end (``ended``): that ``Routed`` is a retry, of a request a policy
    counted at its first try, with what the policy keeps of that count for it (a
    ``_Kept``).

    What a policy learns from its traffic counts a request once, however many replicas it
    was tried on: a try refused before the replica took the prompt is taken back where it
    can be taken back exactly (what it made a replica's cache hold); what cannot be (a
    count-min sketch's conservative update, a learner's window) is counted at the first
    ``Routed`` alone. Each is held by identity: the object itself is kept, so another
    request can never take its ``id``. A try that may have reached its replica (timed out)
    gets no ``Unrouted``, and a retry after it counts again."""

    __slots__ = ("_refused",)

    def __init__(self) -> None:
        # by ``id``: (the request, what was kept for it), oldest first
        self._refused: dict[int, tuple[RouteRequest, _Kept]] = {}

    def refused(self, request: RouteRequest, kept: _Kept) -> None:
        """``request``'s try was refused (``Unrouted``): its next ``Routed`` is a retry,
        handed ``kept``."""
        refused = self._refused
        refused.pop(id(request), None)  # kept in the order refused
        refused[id(request)] = (request, kept)
        if len(refused) > _REFUSED_KEPT:
            del refused[next(iter(refused))]

    def retried(self, request: RouteRequest) -> _Kept | None:
        """For a ``Routed`` of ``request`` that is a retry after a refusal, what was kept
        for it (once: the next try, refused in turn, is told again); else None."""
        if not self._refused:  # (the usual case: a routed request costs only this test)
            return None
        entry = self._refused.pop(id(request), None)
        return entry[1] if entry is not None and entry[0] is request else None

    def ended(self, request: RouteRequest) -> None:
        """``request`` ended (``Finished``): no retry of it is to come. (One kept under its
        ``id`` is itself: the kept request lives, and two live objects never share one.)"""
        if self._refused:
            self._refused.pop(id(request), None)
