"""``kvgate audit LOG [LOG ...] [--json] [--tokenizer PATH]``: the prompt-layout audit of a
capture log (``capture: {path: ...}`` in the gateway's config; give ``PATH.1`` too to
read the rotated part, and with worker processes every worker's ``PATH.w<i>`` and
``PATH.w<i>.1``: their requests are merged by time). See ``gateway.layout_audit`` for
what it finds and how it counts; only the last ``--max-requests`` requests are read."""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from gateway.capture import CaptureRecord
from gateway.layout_audit import ADVICE, AuditLimits, AuditReport, audit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="capture log (JSONL); several are "
                        "merged by time")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--tokenizer", help="tokenizer directory or tokenizer.json, as the "
                        "gateway's 'tokenizer' (default: the project's)")
    defaults = AuditLimits()
    parser.add_argument("--max-requests", type=int, default=defaults.max_requests,
                        help="read only the last N requests (default %(default)s)")
    parser.add_argument("--min-tokens-lost", type=int, default=defaults.min_tokens_lost,
                        help="ignore a divergence that costs a request fewer tokens "
                        "(default %(default)s)")


def read_records(paths: Iterable[Path], keep: int) -> tuple[list[CaptureRecord], int]:
    """The last ``keep`` records of the logs, in time order, and how many lines among
    those read could not be read (all of them when no record was left out, else those
    after the first record kept): the report counts them as requests it skipped. The
    logs are merged by time, each read in its order (a rotated ``PATH.1`` and ``PATH``,
    or the files of a gateway's worker processes, ``PATH.w<i>``, whose requests are
    interleaved in time: read one after the other, a conversation's turns compared out
    of order). Memory is bounded by ``keep``, however many lines are not read: each
    record kept carries the count of unreadable lines just before it in its file."""
    # (bad lines before it in its file, record, bad lines after it where last in its file)
    kept: deque[tuple[int, CaptureRecord, int]] = deque(maxlen=keep)
    left_out = False  # a record was read and not kept: the logs were not read whole
    empty: list[int] = []
    streams = [_records(path, empty) for path in paths]
    for item in heapq.merge(*streams, key=lambda item: item[1].ts):
        left_out = left_out or len(kept) == keep
        kept.append(item)
    bad = sum(empty) + sum(before + after for before, _, after in kept)
    if left_out and kept:  # those before the first record kept were not among those read
        bad -= kept[0][0]
    return [record for _, record, _ in kept], bad


def _records(path: Path, empty: list[int]
             ) -> Iterator[tuple[int, CaptureRecord, int]]:
    """``path``'s records in its order, each with the unreadable lines just before it,
    and after it when it is the file's last; those of a file with no record go to
    ``empty``."""
    bad = 0
    last: tuple[int, CaptureRecord] | None = None
    for line in _lines(path):
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


def _lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                yield line


def format_report(report: AuditReport) -> str:
    """The report for a reader: one paragraph per finding, largest loss first."""
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
        who = f"model {f.model}" + (f", tenant {f.tenant}" if f.tenant else "")
        lines += ["",
                  f"{n}. {f.cause} at token {f.position} ({who}): {f.requests_affected} "
                  f"requests, {f.tokens_lost} tokens lost",
                  f"   {f.context}",
                  f"   fix: {ADVICE[f.cause]}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from kvwire.tokenizer import load_tokenizer

    try:
        limits = AuditLimits(max_requests=args.max_requests,
                             min_tokens_lost=args.min_tokens_lost)
        tokenizer = load_tokenizer(args.tokenizer)
        records, bad = read_records([Path(p) for p in args.logs], limits.max_requests)
    except (ValueError, OSError, OverflowError) as exc:
        print(f"kvgate audit: {exc}", file=sys.stderr)
        return 2
    if not records:  # nothing audited is no finding: say so, and fail
        print(f"kvgate audit: no capture record in {', '.join(args.logs)}"
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
