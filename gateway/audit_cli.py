"""``kvgate audit LOG [LOG ...] [--json] [--tokenizer PATH]``: the prompt-layout audit of a
capture log (``capture: {path: ...}`` in the gateway's config; give ``PATH.1`` too to
read the rotated part, and with worker processes every worker's ``PATH.w<i>`` and
``PATH.w<i>.1``: their requests are merged by time). A log named that does not exist
(``PATH.1`` before the first rotation) is left out, and said so; only when none exists is
it an error. A ``PATH`` that is empty or absent, beside the files of worker processes
(``PATH.w<i>``, ``PATH.w<i>.1``: the gateway's ``capture.path`` with ``--workers``), stands
for those files, and that is said too. See ``gateway.layout_audit`` for
what it finds and how it counts; only the last ``--max-requests`` requests are read. A
line longer than ``--max-line-mb`` (``MAX_LINE_BYTES``, 256 MiB, by default: twice the
longest line a gateway writes with the default ``capture.max_mb``, which keeps none over
half of it, and 16 times the default ``max_body_bytes``) is read past in pieces, never
held whole, and counted: among the lines not readable, and in a note of its own."""

from __future__ import annotations

import argparse
import heapq
import json
import os
import re
import stat
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from gateway.capture import CaptureRecord
from gateway.layout_audit import ADVICE, AuditLimits, AuditReport, audit
from kvwire.arg_types import positive_int
from kvwire.bounded_lines import bounded_lines
from kvwire.terminal_text import printable

MAX_LINE_BYTES = 256 << 20  # a longer line is no capture record (see the module)
# past capture.path: a worker process's file (gateway.workers), maybe rotated (capture_log)
_WORKER_SUFFIX = re.compile(r"\.w(\d+)(\.1)?")
_MIB = 1 << 20


def _request_count(text: str) -> int:
    """``--max-requests``: an integer from 1 to the most requests a list can hold."""
    try:
        value = positive_int(text)
    except ValueError:  # not ArgumentTypeError: no integer
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value > sys.maxsize:
        raise argparse.ArgumentTypeError(f"must be at most {sys.maxsize}, got {value}")
    return value


@dataclass(slots=True)
class LongLines:
    """The lines ``read_records`` read past because they were longer than its bound."""

    count: int = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="capture log (JSONL); several are "
                        "merged by time")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--tokenizer", help="tokenizer directory or tokenizer.json, as the "
                        "gateway's 'tokenizer' (default: the project's)")
    defaults = AuditLimits()
    parser.add_argument("--max-requests", type=_request_count, default=defaults.max_requests,
                        help="read only the last N requests (default %(default)s)")
    parser.add_argument("--min-tokens-lost", type=positive_int,
                        default=defaults.min_tokens_lost,
                        help="ignore a divergence that costs a request fewer tokens "
                        "(default %(default)s)")
    parser.add_argument("--max-line-mb", type=float, default=MAX_LINE_BYTES / _MIB,
                        help="skip (and count) a line longer than this, never holding it "
                        "whole (default %(default)g)")


def worker_logs(path: Path) -> list[Path]:
    """The files of a gateway's worker processes for ``capture.path`` ``path``: each
    worker's ``PATH.w<i>`` and rotated ``PATH.w<i>.1``, by worker, the older first."""
    try:
        names = os.listdir(path.parent)
    except OSError:  # no folder to list: none
        return []
    found = []
    for name in names:
        match = _WORKER_SUFFIX.fullmatch(name, len(path.name))
        if match and name.startswith(path.name):
            found.append((int(match[1]), match[2] is None, path.with_name(name)))
    return [log for *_, log in sorted(found)]


class FoundLogs(NamedTuple):
    logs: list[Path]  # to read, each once
    missing: list[str]  # named, not there: left out
    for_workers: dict[str, list[Path]]  # named, empty or not there: its workers' files read


def find_logs(named: Sequence[str]) -> FoundLogs:
    """The logs to read for those ``named``: each that exists, or, for one empty or absent
    beside worker processes' files, those files; ``FileNotFoundError`` when none."""
    found = FoundLogs([], [], {})
    given = {Path(name) for name in named}
    for name in dict.fromkeys(named):
        try:
            info: os.stat_result | None = os.stat(name)
        except FileNotFoundError:
            info = None
        except OSError:  # another error (a denied directory): reading it tells it
            found.logs.append(Path(name))
            continue
        if info is None or (stat.S_ISREG(info.st_mode) and info.st_size == 0):
            workers = [log for log in worker_logs(Path(name)) if log not in given]
            if workers:
                found.for_workers[name] = workers
                found.logs.extend(log for log in workers if log not in found.logs)
                continue
        if info is None:
            found.missing.append(name)
        else:
            found.logs.append(Path(name))
    if not found.logs:
        raise FileNotFoundError(f"no such file: {', '.join(found.missing)}")
    return found


def read_records(paths: Iterable[Path], keep: int, max_line_bytes: int = MAX_LINE_BYTES,
                 long_lines: LongLines | None = None) -> tuple[list[CaptureRecord], int]:
    """The last ``keep`` records of the logs, in time order, and how many lines among
    those read could not be read (all of them when no record was left out, else those
    after the first record kept): the report counts them as requests it skipped. The
    logs are merged by time, each read in its order (a rotated ``PATH.1`` and ``PATH``,
    or the files of a gateway's worker processes, ``PATH.w<i>``, whose requests are
    interleaved in time: read one after the other, a conversation's turns compared out
    of order). Memory is bounded by ``keep`` and ``max_line_bytes``, however many lines
    are not read: each record kept carries the count of unreadable lines just before it in
    its file; a line longer than ``max_line_bytes`` is one of them, read past in pieces
    (and counted in ``long_lines``)."""
    long_lines = LongLines() if long_lines is None else long_lines
    # (bad lines before it in its file, record, bad lines after it where last in its file)
    kept: deque[tuple[int, CaptureRecord, int]] = deque(maxlen=keep)
    left_out = False  # a record was read and not kept: the logs were not read whole
    empty: list[int] = []
    streams = [_records(path, empty, max_line_bytes, long_lines) for path in paths]
    for item in heapq.merge(*streams, key=lambda item: item[1].ts):
        left_out = left_out or len(kept) == keep
        kept.append(item)
    bad = sum(empty) + sum(before + after for before, _, after in kept)
    if left_out and kept:  # those before the first record kept were not among those read
        bad -= kept[0][0]
    return [record for _, record, _ in kept], bad


def _records(path: Path, empty: list[int], max_line_bytes: int, long_lines: LongLines
             ) -> Iterator[tuple[int, CaptureRecord, int]]:
    """``path``'s records in its order, each with the unreadable lines just before it,
    and after it when it is the file's last; those of a file with no record go to
    ``empty``."""
    bad = 0
    last: tuple[int, CaptureRecord] | None = None
    for _, line in bounded_lines(path, max_line_bytes):
        if line is None:  # longer than the bound: not read
            long_lines.count += 1
            bad += 1
            continue
        try:
            record = CaptureRecord.from_json(line)
        except ValueError:  # orjson.JSONDecodeError is one too
            bad += 1
            continue
        if last is not None:
            yield (*last, 0)
        last, bad = (bad, record), 0
    if last is None:
        empty.append(bad)
    else:
        yield (*last, bad)


def format_report(report: AuditReport) -> str:
    """The report for a reader: one paragraph per finding, largest loss first. What
    comes from the capture log (a model, a tenant, the text of a prompt) is shown as
    ``printable`` text: a client's prompt never sends the reader's terminal a code."""
    lines = [f"{report.requests} requests, {report.prompt_tokens} prompt tokens"
             + (f" ({report.skipped} not readable)" if report.skipped else "")]
    if not report.findings:
        lines.append("no lost prefix sharing found")
        return "\n".join(lines)
    lost = sum(f.tokens_lost for f in report.findings)
    share = lost / report.prompt_tokens if report.prompt_tokens else 0.0
    lines.append(f"{len(report.findings)} findings; a fix would make about {lost} more "
                 f"prompt tokens cacheable ({share:.1%} of all)")
    for n, f in enumerate(report.findings, 1):
        who = f"model {printable(f.model)}" + (
            f", tenant {printable(f.tenant)}" if f.tenant else "")
        needs = " and ".join(f"the {c} at token {at}" for c, at in f.needs)
        needs = f", with {needs} fixed too" if needs else ""
        lines += ["",
                  f"{n}. {f.cause} at token {f.position} ({who}): {f.requests_affected} "
                  f"requests, {f.tokens_lost} tokens lost{needs}",
                  f"   {printable(f.context)}",
                  f"   fix: {ADVICE[f.cause]}"]
        lines += [f"   fix ({c}): {ADVICE[c]}" for c in dict.fromkeys(c for c, _ in f.needs)
                  if c != f.cause]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from kvwire.tokenizer import load_tokenizer

    long_lines = LongLines()
    try:
        limits = AuditLimits(max_requests=args.max_requests,
                             min_tokens_lost=args.min_tokens_lost)
        if not 1 <= args.max_line_mb * _MIB < 1 << 62:  # a byte at least
            raise ValueError(f"--max-line-mb must be from {1 / _MIB:.2g} (one byte) to "
                             f"{1 << 42} MiB, got {args.max_line_mb!r}")
        logs, missing, for_workers = find_logs(args.logs)
        if missing:
            print(f"kvgate audit: no such file, left out: {', '.join(missing)}",
                  file=sys.stderr)
        for name, workers in for_workers.items():
            print(f"kvgate audit: {name} holds no record; reading the files of the "
                  f"gateway's worker processes beside it: {', '.join(map(str, workers))}",
                  file=sys.stderr)
        tokenizer = load_tokenizer(args.tokenizer)
        records, bad = read_records(logs, limits.max_requests, int(args.max_line_mb * _MIB),
                                    long_lines)
    except (ValueError, OSError, OverflowError) as exc:
        print(f"kvgate audit: {exc}", file=sys.stderr)
        return 2
    if long_lines.count:
        print(f"kvgate audit: {long_lines.count} lines longer than {args.max_line_mb:g} MiB "
              "skipped, not read (counted among those not readable; --max-line-mb sets the "
              "bound)", file=sys.stderr)
    if not records:  # nothing audited is no finding: say so, and fail
        print(f"kvgate audit: no capture record in {', '.join(map(str, logs))}"
              + (f" ({bad} lines not readable)" if bad else " (empty)")
              + ": write one with the gateway's capture.path", file=sys.stderr)
        return 2
    report = audit(records, tokenizer, limits)
    if bad:
        report = AuditReport(report.requests, report.skipped + bad, report.prompt_tokens,
                             report.findings)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        print(format_report(report))
    return 0
