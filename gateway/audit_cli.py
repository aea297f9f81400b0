"""``kvgate audit LOG [LOG ...] [--json] [--tokenizer PATH]``: the prompt-layout audit of a
capture log (``capture: {path: ...}`` in the gateway's config; give ``PATH.1`` first to
read the rotated part too). See ``gateway.layout_audit`` for what it finds and how it
counts; only the last ``--max-requests`` requests are read."""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from gateway.capture import CaptureRecord
from gateway.layout_audit import ADVICE, AuditLimits, AuditReport, audit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="capture log (JSONL), oldest "
                        "first")
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
    """The last ``keep`` records of the logs, and how many lines among those read could not
    be read (all of them when no record was left out, else those after the first record
    kept): the report counts them as requests it skipped. Memory is bounded by ``keep``,
    however many lines are not read: each record kept carries the count of unreadable
    lines just before it."""
    kept: deque[tuple[int, CaptureRecord]] = deque(maxlen=keep)  # (bad lines before, record)
    bad_after = 0  # unreadable lines after the newest record (all of them, while none)
    left_out = False  # a record was read and not kept: the logs were not read whole
    for line in _lines(paths):
        try:
            record = CaptureRecord.from_json(line)
        except ValueError:  # orjson.JSONDecodeError is one too
            bad_after += 1
            continue
        left_out = left_out or len(kept) == keep
        kept.append((bad_after, record))
        bad_after = 0
    bad = sum(before for before, _ in kept) + bad_after
    if left_out and kept:  # those before the first record kept were not among those read
        bad -= kept[0][0]
    return [record for _, record in kept], bad


def _lines(paths: Iterable[Path]) -> Iterator[bytes]:
    for path in paths:
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
