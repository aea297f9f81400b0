"""The access log: one JSON line per request on the ``kvgate.access`` logger, opt-in
(``access_log: true``), written when the request ends, whether answered or refused::

    {"id", "tenant", "model", "replica", "route", "status", "prompt_tokens",
     "cached_tokens", "ttft_s", "duration_s"}

Fields unknown at the end (a request refused before routing has no replica) are null; a
request the gateway answered itself has the id its answer carries and its duration. A
text field is cut at ``FIELD_CHARS`` characters, its length told after the cut (a model
name comes from the client, unchecked while no replica lists its models).
Token counts are the replica's own (its ``usage``); ``ttft_s`` is the first byte of a
stream, which comes with its first token.

The lines reach standard error from a thread of their own: a request's line is handed
over, never written on the event loop, so a reader of standard error that falls behind
(a full pipe) holds no request up. At most ``WAITING_LINES`` wait; past that, lines are
dropped, counted in ``kvgate_access_log_dropped_lines_total``, and a warning on
``kvgate.gateway`` says how many once the writer is through.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import IO, Any

import orjson

log = logging.getLogger("kvgate.access")
WAITING_LINES = 8192  # lines that may wait for standard error (about 2 MiB)
FIELD_CHARS = 256  # of a text field (a model's id, as the gateway keeps a listed one)
_DRAIN_AT_EXIT_S = 2.0


class AccessLog:
    """Writes the lines when ``on``; they go to stderr whatever the gateway's log level."""

    __slots__ = ("on",)

    def __init__(self, on: bool, dropped: Callable[[int], None] | None = None) -> None:
        """``dropped``: told how many lines each time lines are lost."""
        self.on = on
        if on:
            log.setLevel(logging.INFO)
            log.propagate = False
            writer = next((h for h in log.handlers if isinstance(h, StderrWriter)), None)
            if writer is None:
                writer = StderrWriter(sys.stderr, WAITING_LINES)
                writer.setFormatter(logging.Formatter("%(message)s"))
                log.addHandler(writer)
            writer.on_dropped = dropped

    def write(self, *, request_id: str | None = None, tenant: str | None = None,
              model: str | None = None, replica: str | None = None, route: str,
              status: str, prompt_tokens: int | None = None,
              cached_tokens: int | None = None, ttft_s: float | None = None,
              duration_s: float | None = None) -> None:
        if not self.on:
            return
        line: dict[str, Any] = {
            "id": _cut(request_id), "tenant": _cut(tenant), "model": _cut(model),
            "replica": _cut(replica), "route": _cut(route), "status": _cut(status),
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached_tokens,
            "ttft_s": None if ttft_s is None else round(ttft_s, 6),
            "duration_s": None if duration_s is None else round(duration_s, 6)}
        log.info(orjson.dumps(line).decode())


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= FIELD_CHARS:
        return text
    return f"{text[:FIELD_CHARS]}... ({len(text)} characters)"


class StderrWriter(logging.Handler):
    """A handler whose ``emit`` only queues the line (at most ``max_waiting``; past that
    it is dropped and counted in ``dropped``); a daemon thread, started at the first
    line, writes what waits to ``stream``. ``drain`` waits for the queue to empty; it runs
    at exit, for at most two seconds."""

    def __init__(self, stream: IO[str], max_waiting: int) -> None:
        super().__init__()
        self.stream = stream
        self.max_waiting = max_waiting
        self.dropped = 0  # lines lost, in all
        self.on_dropped: Callable[[int], None] | None = None  # told of each loss
        self._untold = 0  # ... since the last warning
        self._waiting: deque[str] = deque()
        self._writing = False
        self._changed = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        atexit.register(self.drain, _DRAIN_AT_EXIT_S)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # logging's rule: a line that cannot be made is reported
            self.handleError(record)
            return
        with self._changed:
            if len(self._waiting) >= self.max_waiting:
                self.dropped += 1
                self._untold += 1
                if self.on_dropped is not None:
                    self.on_dropped(1)
                return
            self._waiting.append(line)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="kvgate-access-log")
                self._thread.start()
            self._changed.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait, at most ``timeout_s``, until every waiting line is written."""
        with self._changed:
            return self._changed.wait_for(
                lambda: not self._waiting and not self._writing, timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._writing = False
                self._changed.notify_all()
                self._changed.wait_for(lambda: bool(self._waiting))
                lines = "".join(f"{line}\n" for line in self._waiting)
                count = len(self._waiting)
                self._waiting.clear()
                untold, self._untold = self._untold, 0
                self._writing = True
            try:
                self.stream.write(lines)
                self.stream.flush()
            except (OSError, ValueError):  # standard error closed, or gone
                with self._changed:
                    self.dropped += count
                    untold += count
                if self.on_dropped is not None:
                    self.on_dropped(count)
            if untold:
                logging.getLogger("kvgate.gateway").warning(
                    "access log: %d lines dropped (standard error did not keep up)", untold)
