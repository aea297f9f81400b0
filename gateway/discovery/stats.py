"""What each discovery source tells about itself, for ``/metrics`` and the logs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger("kvgate.discovery")


@dataclass(slots=True)
class SourceStats:
    label: str
    replicas: int = 0  # in the last set the source found
    syncs: int = 0  # sets found and applied
    failures: int = 0  # lookups, lists or watches that failed (the last set stays)
    relists: int = 0  # full lists (Kubernetes): at start, after every watch end or error
    gone: int = 0  # watches answered 410 Gone (their resourceVersion was too old)
    # replicas found that may not join (gateway.discovery.replica_checks): each once
    refused: int = 0
    last_error: str | None = None
    last_sync: float | None = None  # wall-clock seconds of the last applied set

    def synced(self, replicas: int) -> None:
        self.replicas = replicas
        self.syncs += 1
        self.last_sync = time.time()
        self.last_error = None

    def failed(self, error: str) -> None:
        """Count a failure; logged when it differs from the last one (a source down for
        an hour logs once, not once a round)."""
        self.failures += 1
        if error != self.last_error:
            log.warning("discovery %s: %s (keeping the last %d replicas)", self.label, error,
                        self.replicas)
        self.last_error = error
