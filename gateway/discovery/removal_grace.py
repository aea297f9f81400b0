"""A replica missing from one answer is kept until it is missing from ``after`` answers in
a row: a DNS answer can leave addresses out (a truncated or load-balanced answer, a
record briefly absent while a pod's endpoint flaps), and each removal makes the policy
forget what the replica holds. A replica that really left is still ejected meanwhile by
its failing health checks, which do not wait for discovery."""

from __future__ import annotations

from gateway.discovery.targets import Targets


class RemovalGrace:
    """``apply`` each answer's replicas in turn; it returns the replicas to publish."""

    __slots__ = ("_misses", "_published", "after")

    def __init__(self, after: int) -> None:
        if after < 1:
            raise ValueError(f"after must be >= 1, got {after!r}")
        self.after = after
        self._published: Targets = {}
        self._misses: dict[str, int] = {}  # replica -> answers in a row it was missing from

    def apply(self, found: Targets) -> Targets:
        """``found``, and the replicas published before that have been missing from fewer
        than ``after`` answers in a row (their last config)."""
        out = dict(found)
        misses: dict[str, int] = {}
        for rid, config in self._published.items():
            if rid in found:
                continue
            missing = self._misses.get(rid, 0) + 1
            if missing < self.after:
                misses[rid] = missing
                out[rid] = config
        self._published, self._misses = out, misses
        return out
