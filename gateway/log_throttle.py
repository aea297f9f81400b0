"""One kind of trouble logged at most once an interval, with how many came since the last
line: a flood (a full disk, a peer sending wrong secrets, a stalled worker) writes one line
every ``every_s`` seconds, not one a request."""

from __future__ import annotations

import math
import time


class LogThrottle:
    """Says when a line is due for one kind of trouble and how much it held back since."""

    __slots__ = ("_held", "_logged_at", "every_s")

    def __init__(self, every_s: float) -> None:
        if not every_s > 0:
            raise ValueError(f"a log throttle's interval must be above 0 s, got {every_s!r}")
        self.every_s = every_s
        self._logged_at = -math.inf
        self._held = 0

    def due(self, count: int = 1) -> int | None:
        """Count ``count`` more occurrences. None while a line was logged less than
        ``every_s`` seconds ago (these are held back); else a line is due now, and this is
        how many were held back since the last one, not counting these."""
        now = time.monotonic()
        if now - self._logged_at < self.every_s:
            self._held += count
            return None
        held, self._logged_at, self._held = self._held, now, 0
        return held
