"""What the gateway keeps of request bodies for the prompt-layout audit.

Two opt-in stores, both fed by ``Capture.observe`` as a completion or chat request comes in:

- ``capture: {path, sample_rate, max_mb}``: a JSONL log of sampled requests, one
  ``CaptureRecord`` a line, for ``kvgate audit LOG``. A chat is sampled by its first user
  message (every turn of a conversation is kept or none is, so rewritten turns can be
  seen); a completion at random. Written by ``CaptureLog`` off the event loop.
- ``prefix_report: {enabled, recent_requests, max_mb}``: a ring of the most recent
  requests in memory (every one, bounded in count and in bytes), for
  ``GET /admin/prefix-report``. It is also kept whenever the log is on.

Neither ever holds a tenant's cache salt (the body as the client sent it, less any
``cache_salt``) nor an API key (headers are not recorded): a record is the time, model,
tenant name, endpoint and body.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.capture_log import CaptureLog
from gateway.request_parse import ParsedRequest

_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class CaptureConfig:
    """The capture log: off while ``path`` is null. ``sample_rate`` in (0, 1]; the log and
    its one rotated predecessor (``path.1``) together stay under ``max_mb``; ``queue``
    records, ``queue_mb`` of them at most, may wait for the writer, past which new ones
    are dropped (and counted)."""

    path: str | None = None
    sample_rate: float = 1.0
    max_mb: float = 256.0
    queue: int = 1024
    queue_mb: float = 64.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.path is not None and not self.path.strip():
            raise ValueError(f"path must be a file path or null, got {self.path!r}")
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {self.sample_rate!r}")
        if not self.max_mb > 0:
            raise ValueError(f"max_mb must be > 0, got {self.max_mb!r}")
        if self.queue < 1:
            raise ValueError(f"queue must be >= 1, got {self.queue!r}")
        if not self.queue_mb > 0:
            raise ValueError(f"queue_mb must be > 0, got {self.queue_mb!r}")


@dataclass(frozen=True, slots=True)
class PrefixReportConfig:
    """The in-memory ring behind ``GET /admin/prefix-report``: the last
    ``recent_requests`` requests, at most ``max_mb`` of bodies."""

    enabled: bool = False
    recent_requests: int = 512
    max_mb: float = 32.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.recent_requests < 1:
            raise ValueError(f"recent_requests must be >= 1, got {self.recent_requests!r}")
        if not self.max_mb > 0:
            raise ValueError(f"max_mb must be > 0, got {self.max_mb!r}")


@dataclass(frozen=True, slots=True)
class CaptureRecord:
    """One request as the audit reads it. ``size``: bytes of the body as received."""

    ts: float
    model: str
    tenant: str | None
    endpoint: str  # "chat", "completions", "generate" (SGLang's native one), "responses"
    body: Mapping[str, Any]
    size: int = 0

    def to_json(self) -> bytes:
        """One JSONL line (with its newline)."""
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.ts))
        return orjson.dumps({
            "ts": round(self.ts, 3), "time": f"{when}.{int(self.ts * 1000) % 1000:03d}Z",
            "model": self.model, "tenant": self.tenant, "endpoint": self.endpoint,
            "body": self.body}) + b"\n"

    @classmethod
    def from_json(cls, line: bytes | str) -> CaptureRecord:
        """A record from a log line; ``ValueError`` naming what is wrong."""
        data = orjson.loads(line)
        if not isinstance(data, dict):
            raise ValueError("a capture line must be a JSON object")
        body, model, endpoint = data.get("body"), data.get("model"), data.get("endpoint")
        if not isinstance(body, dict):
            raise ValueError("'body' must be an object")
        if endpoint not in ("chat", "completions", "generate", "responses"):
            endpoint = "chat" if "messages" in body else "completions"
        tenant = data.get("tenant")
        ts = data.get("ts")
        return cls(float(ts) if isinstance(ts, int | float) else 0.0,
                   model if isinstance(model, str) else str(body.get("model", "")),
                   tenant if isinstance(tenant, str) else None, endpoint, body,
                   len(line))


def record_of(parsed: ParsedRequest, tenant: str | None, size: int,
              now: float | None = None) -> CaptureRecord:
    """The record of a parsed request: its body as the client sent it, less any
    ``cache_salt`` (a salt names a cache namespace; it never reaches a log)."""
    body = {k: v for k, v in parsed.body.items() if k != "cache_salt"}
    return CaptureRecord(time.time() if now is None else now, parsed.model, tenant,
                         parsed.endpoint, body, size)


class RecentPrompts:
    """The most recent records, at most ``count`` of them and ``max_bytes`` of bodies
    (oldest dropped first), each kept as its JSON line: a parsed body's Python objects
    took about 25 times its bytes (16 MiB of empty lists: 400 MiB). Appended on the event
    loop; ``snapshot`` copies the list of lines, which ``unpack`` reads on a thread."""

    __slots__ = ("_bytes", "_count", "_max_bytes", "_records")

    def __init__(self, count: int, max_bytes: int) -> None:
        self._records: deque[tuple[bytes, int]] = deque()  # (line, bytes charged)
        self._count = count
        self._max_bytes = max_bytes
        self._bytes = 0

    def keeps(self, size: int) -> bool:
        """Whether a record of ``size`` bytes (as received) would be kept."""
        return size <= self._max_bytes

    def add(self, record: CaptureRecord) -> None:
        if not self.keeps(record.size):
            return
        try:
            line = record.to_json()
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: not kept
            return
        self.add_line(line, record.size)

    def add_line(self, line: bytes, size: int) -> None:
        """Keep ``line``, a record's JSON line, of ``size`` bytes as received."""
        size = max(size, len(line))
        self._records.append((line, size))
        self._bytes += size
        while len(self._records) > self._count or self._bytes > self._max_bytes:
            self._bytes -= self._records.popleft()[1]

    def snapshot(self) -> list[bytes]:
        return [line for line, _ in self._records]

    def __len__(self) -> int:
        return len(self._records)

    @property
    def bytes(self) -> int:
        return self._bytes


def unpack(lines: Sequence[bytes]) -> list[CaptureRecord]:
    """The records of a ``RecentPrompts.snapshot`` (on a thread: it parses them)."""
    return [CaptureRecord.from_json(line) for line in lines]


def _sampled(parsed: ParsedRequest, tenant: str | None, rate: float) -> bool:
    """Whether the log keeps this request: a chat by its conversation's first user
    message (the same answer for every turn), anything else at random."""
    if rate >= 1:
        return True
    first_user = next((m.get("content") for m in parsed.messages or ()
                       if isinstance(m, Mapping) and m.get("role") == "user"), None)
    if first_user is None:
        return random.random() < rate
    try:
        key = orjson.dumps([parsed.model, tenant, first_user])
    except orjson.JSONEncodeError:  # content nested deeper than orjson writes
        return random.random() < rate
    return zlib.crc32(key) < rate * 2**32


class Capture:
    """The log and the ring, as configured; ``observe`` is cheap enough for the event
    loop (a shallow copy of the body and a queue put). ``start``/``stop`` run the log's
    writer in the app's lifespan."""

    def __init__(self, log_config: CaptureConfig, report: PrefixReportConfig,
                 serves_report: bool = True) -> None:
        """``serves_report``: whether this process answers ``/admin/prefix-report`` (with
        worker processes, worker 0 alone): one that does not keeps no ring, whatever
        turns it on (a follower's ring, which nothing reads, held ``max_mb`` of bodies)."""
        self.config = log_config
        self.log = CaptureLog(log_config.path, int(log_config.max_mb * _MIB),
                              log_config.queue, int(log_config.queue_mb * _MIB)) \
            if log_config.path else None
        keep_ring = serves_report and (report.enabled or self.log is not None)
        self.recent = RecentPrompts(report.recent_requests, int(report.max_mb * _MIB)) \
            if keep_ring else None

    @property
    def on(self) -> bool:
        return self.log is not None or self.recent is not None

    def observe(self, parsed: ParsedRequest, tenant: str | None, size: int) -> None:
        """Keep the request in the ring and offer it to the log when sampled: serialized
        once, the same line for both."""
        if not self.on:
            return
        ring = self.recent is not None and self.recent.keeps(size)
        log = self.log is not None and _sampled(parsed, tenant, self.config.sample_rate)
        if not (ring or log):
            return
        record = record_of(parsed, tenant, size)
        try:
            line = record.to_json()
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: not kept
            if log:
                assert self.log is not None
                self.log.dropped_large += 1
            return
        if ring:
            assert self.recent is not None
            self.recent.add_line(line, size)
        if log:
            assert self.log is not None
            self.log.offer(line)

    async def start(self) -> None:
        if self.log is not None:
            await self.log.start()

    async def stop(self) -> None:
        if self.log is not None:
            await self.log.stop()
