"""The prompt-layout audit names the first place prompts part: a system prompt with a
timestamp and, a few tokens on, a request id loses its prefix at the timestamp, and a
fix of the id alone gains nothing. The finding is the timestamp's, names the id as
needed too, and counts what fixing both would gain; a divergence counted with an earlier
one fixed names it, and its context shows the request's own text, not the earlier one's
value put in its place."""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import pytest

from gateway.audit_cli import format_report
from gateway.capture import CaptureRecord
from gateway.layout_audit import AuditLimits, audit, render
from kvwire.prompt_layout import common_prefix_tokens
from kvwire.tokenizer import PromptTokenizer, load_tokenizer
from kvwire.tokenizer_build import sample_text

N = 10


@pytest.fixture(scope="module")
def tok() -> PromptTokenizer:
    return load_tokenizer()


def _stamp(i: int) -> str:
    return f"2026-12-01 10:{i * 7 % 60:02d}:{i * 13 % 60:02d}"


def _log(middle: str, *, stamps: bool = True, ids: bool = True) -> list[CaptureRecord]:
    """System prompts with a timestamp, ``middle``, then a request id, then a long
    shared part; ``stamps``/``ids`` False: that value moved out (laid out well)."""
    rng, draw = random.Random(7), random.Random(8)
    tail = sample_text(rng, 150)
    records = []
    for i in range(N):
        rid = str(uuid.UUID(int=draw.getrandbits(128)))
        system = (f"You are a helper. Now: {_stamp(i) if stamps else ''}. {middle}"
                  f"Request {rid if ids else ''}\n{tail}")
        raw: dict[str, Any] = {
            "ts": 1.0 + i, "model": "m", "tenant": None, "endpoint": "chat",
            "body": {"model": "m", "messages": [{"role": "system", "content": system},
                                                {"role": "user", "content": "Go on."}]}}
        records.append(CaptureRecord.from_json(json.dumps(raw)))
    return records


def _shared(records: list[CaptureRecord], tok: PromptTokenizer) -> int:
    """Prompt tokens each request shares with its best earlier one, summed."""
    ids = [tok.encode(render(r, tok, 1 << 20)[0]) for r in records]
    return sum(max(common_prefix_tokens(ids[a], ids[b]) for a in range(b))
               for b in range(1, len(ids)))


def test_the_first_varying_span_is_named_with_the_later_one_it_needs(
        tok: PromptTokenizer) -> None:
    records = _log("")
    report = audit(records, tok)
    assert [f.cause for f in report.findings] == ["timestamp"], report.findings
    (finding,) = report.findings
    ids_at = finding.needs[0].position
    assert [n.cause for n in finding.needs] == ["uuid"] and finding.position < ids_at
    assert finding.requests_affected == N - 1
    # what moving both out gains, and no more: the id alone would gain nothing
    want = _shared(_log("", stamps=False, ids=False), tok) - _shared(records, tok)
    assert abs(finding.tokens_lost - want) <= 2 * (N - 1), (finding.tokens_lost, want)
    assert _shared(_log("", ids=False), tok) == _shared(records, tok)
    text = format_report(report)
    assert (f"1. timestamp at token {finding.position} (model m): {N - 1} requests, "
            f"{finding.tokens_lost} tokens lost, with the uuid at token {ids_at} fixed too"
            ) in text
    assert "   fix (uuid): move request, session or trace ids" in text
    assert report.as_json()["findings"][0]["needs"] == [
        {"cause": "uuid", "position": ids_at}]


def test_a_later_divergence_names_the_earlier_and_shows_its_own_text(
        tok: PromptTokenizer) -> None:
    records = _log("a " * 12)
    report = audit(records, tok, AuditLimits(min_tokens_lost=1))
    by_cause = {f.cause: f for f in report.findings}
    stamp, rid = by_cause["timestamp"], by_cause["uuid"]
    assert stamp.needs == () and [n.cause for n in rid.needs] == ["timestamp"]
    assert rid.position > stamp.position
    before, inside = rid.context.split("«", 1)
    later_id = inside.split(" | ", 1)[1].split("»", 1)[0]
    (system,) = [r.body["messages"][0]["content"] for r in records
                 if later_id in r.body["messages"][0]["content"]]
    # the later request's own time before its id (within the context shown), not the
    # earlier request's put in its place
    assert before == system[: system.index(later_id)][-len(before):]
    assert len(before) >= len(". " + "a " * 12 + "Request ") + 2
