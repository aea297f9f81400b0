"""The capture log's writer: JSONL appended from a task of its own, off the event loop.

Records wait as their JSON lines in a queue bounded in count and in bytes (``offer`` never
blocks: past either bound a record is dropped and counted; a record's parsed body, kept
instead, held many times its bytes, and a writer stalled on a slow disk let ``queue`` of
the largest bodies pile up); the writer task appends what is waiting in a worker thread,
one batch at a time. A batch counts against both bounds until it is written: the lines
held, queued or being written, are at most ``queue`` records and ``queue_bytes``.
Size: when the file would pass half of ``max_bytes`` it is renamed to ``PATH.1``
(replacing the previous one) and a new file is begun, so the two together stay under
``max_bytes`` and the newest traffic is always kept; a file it makes is readable by its
owner only (0600, whatever the umask). A record larger than half of ``max_bytes``, or
nested deeper than orjson writes, is dropped; the records of a batch the writer fails on
that it had not written are dropped (counted) and logged, and the writer goes on, opening
the file again if it was left closed. A log moved or removed by someone else is begun
again at ``PATH`` when it is next rotated.
Counts: the file is written unbuffered, so a record is counted ``written`` once the system
took all of its line, and one whose write failed (a full disk) is counted lost, never
both; a line the system took part of is ended by a newline before the next record, so
a reader sees one line it cannot parse and the records after it whole (as is the part of
a line a file opened ends in: a writer stopped part-way through one). Failures are
logged at most once per ``FAILED_LOG_S``, with the records lost since (a full disk
failed every batch, a line each).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING

import orjson

from gateway.log_throttle import LogThrottle

if TYPE_CHECKING:
    from gateway.capture import CaptureRecord

log = logging.getLogger("kvgate.capture")
_BATCH = 256  # records written per worker-thread call
FAILED_LOG_S = 10.0  # failed writes are logged at most this often


class CaptureLog:
    def __init__(self, path: str, max_bytes: int, queue: int,
                 queue_bytes: int = 64 << 20) -> None:
        self.path = Path(path)
        self.max_file_bytes = max_bytes // 2
        self.queue_size = queue
        self.queue_bytes = queue_bytes  # bytes of lines that may wait for the writer
        self.queued_bytes = 0  # ... held now: queued, or in the batch being written
        self._queued = 0  # records held now, as queued_bytes
        self.written = 0  # records appended
        self.dropped_full = 0  # records lost to a full queue (counted on the event loop)
        self.dropped_large = 0  # ... too large, or unwritable (counted by the writer)
        self.rotations = 0
        self._queue: asyncio.Queue[bytes | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._file: IO[bytes] | None = None
        self._file_bytes = 0
        self._torn = False  # the file ends in part of a line (a write that failed)
        self._failed_log = LogThrottle(FAILED_LOG_S)

    @property
    def dropped(self) -> int:
        return self.dropped_full + self.dropped_large

    @staticmethod
    def check_path(path: str) -> None:
        """Open ``path`` for appending as ``start`` will (its folder made if missing) and
        close it again: at start-up, before anything is served, an ``OSError`` naming the
        path and the system's reason when the log could not be written."""
        try:
            _open_for_appending(Path(path)).close()
        except OSError as exc:
            raise _cannot_open(Path(path), exc) from exc

    async def start(self) -> None:
        """Open the file (its folder made if missing) and start the writer task; an
        ``OSError`` naming the path when it cannot be opened."""
        try:
            await asyncio.to_thread(self._open)
        except OSError as exc:
            raise _cannot_open(self.path, exc) from exc
        self._queue = asyncio.Queue(self.queue_size + 1)  # + the stop marker
        self.queued_bytes = self._queued = 0  # a writer stopped early left none held
        self._task = asyncio.create_task(self._run(), name="kvgate-capture-writer")

    def offer(self, record: CaptureRecord | bytes) -> None:
        """Queue ``record`` (or its JSON line, ``CaptureRecord.to_json``) for the writer,
        or drop it (counted): when the queue holds ``queue`` records or would pass
        ``queue_bytes``, or the writer is not running (``dropped_full``); when it is nested
        deeper than orjson writes or its line is larger than a file may be
        (``dropped_large``)."""
        queue = self._queue
        if queue is None or self._queued >= self.queue_size:
            self.dropped_full += 1
            return
        if isinstance(record, bytes):
            line = record
        else:
            try:
                line = record.to_json()
            except orjson.JSONEncodeError:  # nested deeper than orjson writes (254 levels)
                self.dropped_large += 1
                return
        if len(line) > self.max_file_bytes:
            self.dropped_large += 1
            return
        if self.queued_bytes + len(line) > self.queue_bytes:
            self.dropped_full += 1
            return
        self.queued_bytes += len(line)
        self._queued += 1
        queue.put_nowait(line)

    async def stop(self) -> None:
        """Write what is queued, then stop the writer and close the file."""
        if self._queue is not None and self._task is not None:
            self._queue.put_nowait(None)
            try:
                await self._task
            finally:
                self._task = None
                self._queue = None
        await asyncio.to_thread(self._close)

    async def _run(self) -> None:
        queue = self._queue
        assert queue is not None
        stopping = False
        while not stopping:
            batch: list[bytes] = []
            item = await queue.get()
            while True:
                if item is None:
                    stopping = True
                    break
                batch.append(item)
                if len(batch) >= _BATCH or queue.empty():
                    break
                item = queue.get_nowait()
            if batch:
                written = self.written
                try:
                    await asyncio.to_thread(self._write, batch)
                except OSError as exc:
                    lost = len(batch) - (self.written - written)  # those not yet written
                    self.dropped_large += lost
                    self._log_failed(exc, lost)
                except Exception:  # the writer must outlive a record it cannot write
                    lost = len(batch) - (self.written - written)
                    self.dropped_large += lost
                    log.exception("capture log %s: %d records lost", self.path, lost)
                finally:  # held until now: written, or lost
                    self.queued_bytes -= sum(len(line) for line in batch)
                    self._queued -= len(batch)

    def _log_failed(self, exc: OSError, lost: int) -> None:
        """A failed write: logged at most once per ``FAILED_LOG_S``, with the records lost
        since the last line."""
        since = self._failed_log.due(lost)
        if since is None:
            return
        more = f" ({since} more lost in the last {FAILED_LOG_S:g} s)" if since else ""
        log.warning("capture log %s: cannot write (%s); %d records lost%s",
                    self.path, exc.strerror or exc, lost, more)

    # -- in the worker thread --------------------------------------------------------------
    def _open(self) -> None:
        self._file = _open_for_appending(self.path)
        self._file_bytes = self._file.tell()
        self._torn = self._file_bytes > 0 and _ends_in_part_of_a_line(self.path)

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _rotate(self) -> None:
        """Rename the file to ``PATH.1`` and begin a new one; when it is no longer at
        ``PATH`` (moved or removed by someone else), just begin a new one."""
        self._close()
        try:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self.rotations += 1
        except FileNotFoundError:
            pass  # moved away: what was written there went with it
        self._open()

    def _write(self, batch: list[bytes]) -> None:
        if self._file is None:  # a rotation that failed left it closed
            self._open()
        start = 0
        while start < len(batch):
            if self._file_bytes + len(batch[start]) > self.max_file_bytes:
                self._rotate()
            # batch[start:end]: the lines that fit the file as it is, one at least: a file
            # begun anew that is not empty (PATH made again by someone else, or the rename
            # a no-op: PATH.1 a hard link to it) takes the line past the bound
            end, size = start + 1, self._file_bytes + len(batch[start])
            while end < len(batch) and size + len(batch[end]) <= self.max_file_bytes:
                size += len(batch[end])
                end += 1
            self._append(batch[start:end])
            start = end

    def _append(self, lines: list[bytes]) -> None:
        """Write ``lines`` whole, counting each in ``written`` once the system took all of
        it; an ``OSError`` when a write fails, the lines after the last whole one not
        counted."""
        assert self._file is not None
        fd = self._file.fileno()
        lead = b"\n" if self._torn else b""  # ends the part of a line a failed write left
        data = memoryview(lead + b"".join(lines))
        done = 0  # data[:done] is in the file
        try:
            while done < len(data):
                done += os.write(fd, data[done:])
        finally:
            if done >= len(lead):
                self._torn = False
            # data[len(lead):whole]: the lines taken whole; data[whole:done] part of one
            whole = len(lead)
            for line in lines:
                if whole + len(line) > done:
                    if done > whole:
                        self._torn = True
                    break
                whole += len(line)
                self.written += 1
            self._file_bytes += done


def _open_for_appending(path: Path) -> IO[bytes]:
    """``path`` opened for appending; a file it makes is its owner's alone (0600: it holds
    every tenant's prompts), one that exists keeps its mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        return os.fdopen(fd, "ab", buffering=0)  # written whole lines at a time (``_append``)
    except BaseException:
        os.close(fd)
        raise


def _ends_in_part_of_a_line(path: Path) -> bool:
    """Whether the file at ``path`` ends in part of a line (its last byte no newline);
    one that cannot be read is taken to end whole."""
    try:
        with path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) not in (b"\n", b"")
    except OSError:
        return False


def _cannot_open(path: Path, exc: OSError) -> OSError:
    return OSError(exc.errno, f"capture.path {str(path)!r}: cannot open it for appending: "
                   f"{exc.strerror}")
