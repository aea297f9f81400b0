"""The least seconds a config takes, shared by every section that holds times
(``gateway.config``, ``gateway.discovery.config``, ``gateway.peer_config``).

A loop's period (health checks, scrapes, DNS lookups, Kubernetes lists, peer lookups)
shorter than ``LEAST_INTERVAL_S`` spins a core; a timeout shorter than ``LEAST_TIMEOUT_S``
no answer meets. A typo's 1e-9 for 1e9 is refused at load, not served as a gateway that
fails everything.
"""

from __future__ import annotations

LEAST_INTERVAL_S = 0.01
LEAST_TIMEOUT_S = 0.001


def at_least(obj: object, least: float, *names: str) -> None:
    """The times ``names`` of ``obj`` are at least ``least`` seconds (NaN is not)."""
    for name in names:
        value = getattr(obj, name)
        if not value >= least:
            raise ValueError(f"{name} must be at least {least:g} s, got {value!r}")
