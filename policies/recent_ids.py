"""``RecentIds``: the replicas a policy keeps nothing of lately (removed from the fleet, or
no longer serving its model), until a decision's views hold one again. A route told to one
meanwhile (a retry on a decision made before, another worker's route told late) is not
kept either: it would give the replica state that nothing drops again, found if its id
comes back. ``cost`` and ``radix`` keep their lists in it.

Bounded: the last ``KEPT`` ids noted, the oldest let go first (a replica that left that
long ago is taken to be past its late routes).
"""

from __future__ import annotations

from collections.abc import Iterator

KEPT = 1024  # ids of the replicas noted last, whose late routes are not kept


class RecentIds:
    """Replica ids, oldest noted first, at most ``KEPT``; not thread-safe (a policy's)."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: dict[str, None] = {}

    def note(self, replica: str) -> None:
        """Add ``replica`` (kept at its place if there); let the oldest go past ``KEPT``."""
        ids = self._ids
        ids[replica] = None
        if len(ids) > KEPT:
            del ids[next(iter(ids))]

    def discard(self, replica: str) -> None:
        """Drop ``replica`` if noted (a decision's views hold it again)."""
        self._ids.pop(replica, None)

    def __contains__(self, replica: object) -> bool:
        return replica in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)
