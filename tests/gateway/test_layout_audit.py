"""The prompt-layout audit on synthetic logs, one cause planted in each: the cause found,
at the planted place, with the tokens a fix saves checked against a brute-force oracle
(every request laid out well, the best shared prefix over all earlier requests)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from gateway.capture import CaptureRecord
from gateway.layout_audit import AuditLimits, audit, render
from gateway.layout_causes import CAUSES, common_prefix_chars, find_fix
from kvwire.prompt_layout import common_prefix_tokens
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from tests.support import prompt_logs
from tests.support.prompt_logs import PlantedLog

MIN_LOST = AuditLimits().min_tokens_lost


@pytest.fixture(scope="module")
def tok() -> PromptTokenizer:
    return load_tokenizer()


def records(raw: Sequence[dict[str, Any]]) -> list[CaptureRecord]:
    return [CaptureRecord.from_json(json.dumps(r)) for r in raw]


def ids_of(raw: Sequence[dict[str, Any]], tok: PromptTokenizer) -> list[list[int]]:
    return [tok.encode(render(r, tok, 1 << 20)[0]) for r in records(raw)]


def best_shared(ids: list[list[int]], b: int) -> int:
    """Tokens request ``b`` shares with the earlier request that shares the most."""
    return max(common_prefix_tokens(ids[a], ids[b]) for a in range(b))


def oracle(log: PlantedLog, tok: PromptTokenizer) -> dict[int, int]:
    """Per request, the prompt tokens it would share more if every request were laid out
    well (only requests losing at least ``MIN_LOST``)."""
    now, fixed = ids_of(log.records, tok), ids_of(log.fixed, tok)
    lost = {b: best_shared(fixed, b) - best_shared(now, b) for b in range(1, len(now))}
    return {b: n for b, n in lost.items() if n >= MIN_LOST}


def planted_position(log: PlantedLog, tok: PromptTokenizer) -> tuple[int, int]:
    """The token range where the first planted value of a request sits (its start, and
    past its end), in the first affected request's rendering."""
    b = next(i for i, p in enumerate(log.planted) if p and i)
    text = render(records(log.records)[b], tok, 1 << 20)[0]
    where = text.index(log.planted[b][:40])
    start = len(tok.encode(text[:where]))
    return start - 1, start + len(tok.encode(log.planted[b]))


LOGS: dict[str, Callable[[], PlantedLog]] = {
    "timestamp": prompt_logs.timestamp_log,
    "uuid": prompt_logs.uuid_log,
    "json_key_order": prompt_logs.json_key_order_log,
    "chunk_order": prompt_logs.chunk_order_log,
    "history_rewrite": prompt_logs.history_rewrite_log,
}


@pytest.mark.parametrize("cause", sorted(LOGS))
def test_each_planted_cause_is_found_where_it_is_with_what_it_costs(
        cause: str, tok: PromptTokenizer) -> None:
    log = LOGS[cause]()
    report = audit(records(log.records), tok)
    assert report.requests == len(log.records) and report.skipped == 0
    assert [f.cause for f in report.findings] == [cause], report.findings
    (finding,) = report.findings
    expected = oracle(log, tok)
    assert finding.requests_affected == len(expected)
    want = sum(expected.values())
    # the audit edits one request against one earlier; the oracle re-renders them all:
    # token merges where a value was cut out may differ by a token or two per request
    assert abs(finding.tokens_lost - want) <= 2 * len(expected), (finding.tokens_lost, want)
    lo, hi = planted_position(log, tok)
    assert lo <= finding.position <= hi, (finding.position, lo, hi)
    assert finding.model == prompt_logs.MODEL and finding.tenant == "acme"
    assert "«" in finding.context and "»" in finding.context


def test_the_context_shows_both_values(tok: PromptTokenizer) -> None:
    log = prompt_logs.timestamp_log()
    (finding,) = audit(records(log.records), tok).findings
    inside = finding.context.split("«", 1)[1].split("»", 1)[0]
    earlier, later = inside.split(" | ")
    assert earlier in log.planted and later in log.planted and earlier != later
    assert "Current time: «" in finding.context


def test_responses_requests_are_audited_as_the_chats_they_carry(tok: PromptTokenizer
                                                                 ) -> None:
    log = prompt_logs.timestamp_log()
    responses = []
    for record in log.records:  # the system message as instructions, the rest as input
        system, *rest = record["body"]["messages"]
        responses.append({**record, "endpoint": "responses", "body": {
            "model": record["model"], "instructions": system["content"], "input": rest}})
    report = audit(records(responses), tok)
    assert report.skipped == 0
    (finding,) = report.findings
    assert finding.cause == "timestamp" and "Current time: «" in finding.context


def test_a_clean_log_has_no_findings(tok: PromptTokenizer) -> None:
    raw = prompt_logs.clean_log()
    report = audit(records(raw), tok)
    assert report.requests == len(raw) and report.findings == ()
    assert report.prompt_tokens == sum(len(ids) for ids in ids_of(raw, tok))


def test_tenants_and_models_are_audited_apart(tok: PromptTokenizer) -> None:
    """Two tenants' timestamps never count against each other: with one request each,
    nothing is found; the same log as one tenant has the finding."""
    log = prompt_logs.timestamp_log(n=4)
    apart = [dict(r, tenant=f"t{i}") for i, r in enumerate(log.records)]
    assert audit(records(apart), tok).findings == ()
    other_models = [dict(r, model=f"m{i}") for i, r in enumerate(log.records)]
    assert audit(records(other_models), tok).findings == ()
    assert audit(records(log.records), tok).findings[0].requests_affected == 3


def test_two_causes_in_one_log_are_both_found(tok: PromptTokenizer) -> None:
    raw = prompt_logs.timestamp_log().records + prompt_logs.history_rewrite_log().records
    causes = sorted(f.cause for f in audit(records(raw), tok).findings)
    assert causes == ["history_rewrite", "timestamp"]


def test_cost_is_bounded_by_max_requests(tok: PromptTokenizer) -> None:
    log = prompt_logs.timestamp_log(n=12)
    report = audit(records(log.records), tok, AuditLimits(max_requests=5))
    assert report.requests == 5
    assert report.findings[0].requests_affected == 4  # the last five, compared among them


def test_unreadable_requests_are_counted_not_fatal(tok: PromptTokenizer) -> None:
    raw = prompt_logs.timestamp_log(n=3).records
    broken = [*raw, {"model": "m", "endpoint": "chat", "body": {"messages": "nope"}},
              {"model": "m", "endpoint": "completions", "body": {"prompt": {"x": 1}}}]
    report = audit(records(broken), tok)
    assert (report.requests, report.skipped) == (3, 2)


@pytest.mark.parametrize(("a", "b", "cause"), [
    ("Now: 2026-12-01 10:00:03 UTC. Rules follow.", "Now: 2026-12-01 11:59:59 UTC. Rules "
     "follow.", "timestamp"),
    ("Sent Mon, Dec 1, 2026 then", "Sent Mon, Dec 2, 2026 then", "timestamp"),
    ("at 1764547200 s", "at 1764550000 s", "timestamp"),
    ("trace 3f2a9c1e-0b4d-4e5f-8a7b-1c2d3e4f5a6b ok", "trace 9d8c7b6a-5f4e-4d3c-2b1a-0f9e8d7c6b5a "
     "ok", "uuid"),
    ("session req_8f3kd92jd0x1 ok", "session req_1a2b3c4d5e6f ok", "uuid"),
    ('{"a": 1, "b": [1, 2]} tail', '{"b": [1, 2], "a": 1} tail', "json_key_order"),
    ("intro\n\nalpha one\n\nbeta two\n\ngamma three\n\nQ", "intro\n\nbeta two\n\nalpha one\n\n"
     "gamma three\n\nQ", "chunk_order"),
    ("Hello Alice, the rules are long and fixed here.", "Hello Bob, the rules are long and "
     "fixed here.", "other"),
])
def test_causes_are_told_apart(a: str, b: str, cause: str) -> None:
    at = common_prefix_chars(a, b)
    fix = find_fix(a, b, at)
    assert fix is not None and fix.cause == cause
    assert fix.cause in CAUSES
    fixed = fix.apply(b)
    assert common_prefix_chars(a, fixed) > at  # the edit undoes the divergence


def test_different_questions_are_no_cause() -> None:
    a, b = "Rules.\nQ: what is the term?", "Rules.\nQ: who signs the lease first?"
    at = common_prefix_chars(a, b)
    fix = find_fix(a, b, at)
    assert fix is None  # too short a tail to count; see the audit


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="max_requests must be an integer >= 1, got 0"):
        AuditLimits(max_requests=0)
