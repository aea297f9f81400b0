"""The access log: one JSON line per request on the ``kvgate.access`` logger, opt-in
(``access_log: true``), written when the request ends, whether answered or refused::

    {"id", "tenant", "model", "replica", "route", "status", "prompt_tokens",
     "cached_tokens", "ttft_s", "duration_s"}

Fields unknown at the end (a request refused before routing has no replica) are null.
Token counts are the replica's own (its ``usage``); ``ttft_s`` is the first byte of a
stream, which comes with its first token.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

log = logging.getLogger("kvgate.access")


class AccessLog:
    """Writes the lines when ``on``; they go to stderr whatever the gateway's log level."""

    __slots__ = ("on",)

    def __init__(self, on: bool) -> None:
        self.on = on
        if on:
            log.setLevel(logging.INFO)
            log.propagate = False
            if not any(isinstance(h, logging.StreamHandler) for h in log.handlers):
                handler = logging.StreamHandler()
                handler.setFormatter(logging.Formatter("%(message)s"))
                log.addHandler(handler)

    def write(self, *, request_id: str | None = None, tenant: str | None = None,
              model: str | None = None, replica: str | None = None, route: str,
              status: str, prompt_tokens: int | None = None,
              cached_tokens: int | None = None, ttft_s: float | None = None,
              duration_s: float | None = None) -> None:
        if not self.on:
            return
        line: dict[str, Any] = {
            "id": request_id, "tenant": tenant, "model": model, "replica": replica,
            "route": route, "status": status, "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens,
            "ttft_s": None if ttft_s is None else round(ttft_s, 6),
            "duration_s": None if duration_s is None else round(duration_s, 6)}
        log.info(orjson.dumps(line).decode())
