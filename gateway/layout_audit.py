"""The prompt-layout audit: prefixes that requests should share but don't, why, and the
prompt tokens a fix would make cacheable. ``kvgate audit LOG`` runs it on a capture log,
``GET /admin/prefix-report`` on the gateway's recent requests.

Requests are rendered as the gateway renders them (its chat rendering and tokenizer),
grouped by model and tenant (tenants never share a cache), and taken in arrival order.
Each request ``b`` is compared with a few earlier ones of its group (``audit_index``: its
conversation's previous turn, the prompt sharing the longest prefix, those sharing the
most content further in, the latest). Where ``b`` parts from one of them,
``layout_causes.find_fix`` names the cause and the edit of ``b`` that would undo it; the
edit is applied and the shared prefix measured again, in the earlier prompt's tokens. The
tokens it grows by, less a moved-out value's own tokens and counted only past what ``b``
already shares with any earlier request, are the divergence's ``tokens_lost``; it counts
when they reach ``min_tokens_lost``. Edits are applied in turn (a later divergence is
counted as if the earlier ones were fixed, and names them in ``needs``), and the comparison
that would gain most is kept. A divergence that gains too little alone because a later one
still breaks the prefix (a timestamp, then a request id a few tokens on) is not dropped: it
is where the prompts part, so it takes the tokens the later ones gain with it, and names
them in ``needs``; no later divergence claims tokens that an earlier one still loses.
Divergences of one cause in one group (and, for a value, at one place) form a finding.

Cost is bounded: the last ``max_requests`` requests, prompts cut at ``max_prompt_chars``,
``candidates`` comparisons and ``max_fixes`` edits per request; each prompt is encoded
once, and encoding is most of the time.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from gateway.audit_index import AuditGroup, AuditPrompt
from gateway.capture import CaptureRecord
from gateway.layout_causes import Fix, Turns, common_prefix_chars, find_fix
from gateway.responses_request import responses_fields
from kvwire.chat_messages import ChatFormatError, check_tools, normalize_messages
from kvwire.openai_schema import BadRequest
from kvwire.prompt_layout import common_prefix_tokens
from kvwire.tokenizer import PromptTokenizer

ADVICE = {
    "timestamp": "move the date or time after the shared part (the end of the prompt), or "
                 "round it so it changes rarely",
    "uuid": "move request, session or trace ids out of the prompt, or after the shared part",
    "json_key_order": "serialize tool schemas and JSON with a fixed key order "
                      "(json.dumps(..., sort_keys=True))",
    "chunk_order": "put retrieved chunks in a fixed order (by document id), not by relevance",
    "history_rewrite": "send earlier turns exactly as the previous request rendered them; "
                       "a template that rewrites them makes every turn a miss",
    "other": "move what varies per request after the part every request shares",
}
_BATCH = 64  # prompts encoded together
_CONTEXT_CHARS = 40
_SPAN_CHARS = 60


@dataclass(frozen=True, slots=True)
class AuditLimits:
    max_requests: int = 2000
    max_prompt_chars: int = 65536
    min_tokens_lost: int = 16  # per request: one KV block of a usual engine
    candidates: int = 4
    max_fixes: int = 8

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_prompt_chars", "min_tokens_lost", "candidates",
                     "max_fixes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


class Needed(NamedTuple):
    """Another divergence of the same prompts that must be fixed too for a finding's
    ``tokens_lost``: its cause and token position."""

    cause: str
    position: int


@dataclass(frozen=True, slots=True)
class Finding:
    cause: str
    position: int  # token index in the later request where it parts from the earlier
    context: str  # the text around it: «the earlier request's text | the later one's»
    requests_affected: int
    tokens_lost: int
    model: str
    tenant: str | None
    # the other divergences (earlier ones, and later ones it gains with) fixed in the count
    needs: tuple[Needed, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"cause": self.cause, "position": self.position, "context": self.context,
                "requests_affected": self.requests_affected,
                "tokens_lost": self.tokens_lost, "model": self.model,
                "tenant": self.tenant, "advice": ADVICE[self.cause],
                "needs": [n._asdict() for n in self.needs]}


@dataclass(frozen=True, slots=True)
class AuditReport:
    requests: int  # requests analysed
    skipped: int  # requests that could not be rendered
    prompt_tokens: int  # their prompt tokens, as the gateway's tokenizer counts
    findings: tuple[Finding, ...]

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "skipped": self.skipped,
                "prompt_tokens": self.prompt_tokens,
                "tokens_lost": sum(f.tokens_lost for f in self.findings),
                "findings": [f.as_json() for f in self.findings]}


@dataclass(slots=True)
class _Divergence:
    request: int  # the later request's index in the audit
    cause: str
    position: int
    context: str
    tokens_lost: int
    site: int  # where in the text a value starts (timestamp, uuid, other), else -1
    needs: tuple[Needed, ...]


def render(record: CaptureRecord, tokenizer: PromptTokenizer, max_chars: int
           ) -> tuple[str, list[dict[str, str]] | None]:
    """The prompt text the gateway tokenizes for ``record`` (cut at ``max_chars``) and
    its normalized messages; ``ValueError`` when it has no prompt to read."""
    body = record.body
    if record.endpoint in ("chat", "responses"):
        if record.endpoint == "responses":  # the chat it carries
            try:
                fields = responses_fields(body)
            except BadRequest as exc:
                raise ValueError(str(exc)) from None
            messages, raw_tools = fields.messages, fields.tools
        else:
            messages, raw_tools = body.get("messages"), body.get("tools")
        if not isinstance(messages, list):
            raise ValueError("a chat request without 'messages'")
        normalized = normalize_messages(messages, lenient=True)
        tools = check_tools(raw_tools)
        return tokenizer.render_chat(normalized, tools=tools)[:max_chars], normalized
    prompt = body.get("prompt") if record.endpoint != "generate" else \
        body.get("text") if body.get("text") is not None else body.get("input_ids")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        try:
            prompt = tokenizer.decode(prompt)
        except OverflowError:  # an id below 0 or past 2**32: SGLang's input_ids pass as sent
            raise ValueError("a token id the tokenizer cannot decode") from None
    if not isinstance(prompt, str):
        raise ValueError("a completion without one text prompt")
    return prompt[:max_chars], None


def _context(b: str, fix: Fix) -> str:
    def short(text: str) -> str:
        text = text if len(text) <= _SPAN_CHARS else text[: _SPAN_CHARS - 3] + "..."
        return text.replace("\n", "\\n")
    before = b[max(0, fix.start - _CONTEXT_CHARS): fix.start].replace("\n", "\\n")
    after = b[fix.end: fix.end + _CONTEXT_CHARS].replace("\n", "\\n")
    return f"{before}«{short(fix.replacement)} | {short(b[fix.start:fix.end])}»{after}"


class _Auditor:
    def __init__(self, limits: AuditLimits) -> None:
        self.limits = limits

    def chain(self, a: AuditPrompt, b: AuditPrompt, turns: Turns | None, shared: int
              ) -> list[_Divergence]:
        """The divergences of ``b`` from ``a``, each fixed in turn; ``shared``: the tokens
        ``b`` already shares with some earlier request. Token counts come from ``a``'s own
        encoding: where ``b``'s text agrees with ``a``'s, so do its tokens (to within the
        one token that may merge across the point where they part)."""
        text = b.text
        found: list[_Divergence] = []
        applied: list[Needed] = []  # every fix so far, in order
        # fixes since the last one counted, gaining too little so far: the first of them
        # takes what they gain together (it is where the prompts part)
        pending: list[tuple[Needed, str, int]] = []  # with its context and site
        gained = 0
        shift = 0  # len(text) - len(b.text): b's own text lies ``shift`` before a fix's span
        fixed_to = 0  # in b.text: where the last fix's span ends
        for _ in range(self.limits.max_fixes):
            at = common_prefix_chars(a.text, text)
            if at >= len(a.text) or at >= len(text):
                break
            fix = find_fix(a.text, text, at, turns)
            if fix is None:
                break
            before = a.tokens_within(at)
            # the text around it as b has it: not with the earlier fixes applied
            own = replace(fix, start=fix.start - shift, end=fix.end - shift)
            context = _context(b.text, own) if own.start >= fixed_to else _context(text, fix)
            text = fix.apply(text)
            shift += len(fix.replacement) - (fix.end - fix.start)
            fixed_to = max(fixed_to, own.end)
            after = a.tokens_within(common_prefix_chars(a.text, text))
            # a moved-out value's own tokens: in a, from where it starts
            moved = (a.tokens_within(fix.start + len(fix.replacement))
                     - a.tokens_within(fix.start)) if fix.moves_out else 0
            if after <= before:
                break
            gained += max(0, after - max(before, shared)) - moved
            pending.append((Needed(fix.cause, before), context,
                            fix.start if fix.moves_out else -1))
            if gained >= self.limits.min_tokens_lost:
                (first, context, site), later = pending[0], [n for n, _, _ in pending[1:]]
                found.append(_Divergence(b.index, first.cause, first.position, context,
                                         gained, site, tuple(applied + later)))
                applied += [n for n, _, _ in pending]
                pending, gained = [], 0
            shared = max(shared, after)
        return found

    def compare(self, group: AuditGroup, b: AuditPrompt) -> list[_Divergence]:
        options = group.candidates(b, self.limits.candidates)
        shared = max((common_prefix_tokens(a.ids, b.ids) for a, _ in options), default=0)
        best: list[_Divergence] = []
        for a, turns in options:
            found = self.chain(a, b, turns, shared)
            if sum(d.tokens_lost for d in found) > sum(d.tokens_lost for d in best):
                best = found
        return best


def audit(records: Iterable[CaptureRecord], tokenizer: PromptTokenizer,
          limits: AuditLimits | None = None) -> AuditReport:
    """The audit of ``records`` (in arrival order; the last ``max_requests`` are read).
    CPU-bound: run it off the event loop."""
    limits = limits or AuditLimits()
    kept = list(records)[-limits.max_requests:]
    auditor = _Auditor(limits)
    groups: dict[tuple[str, str | None], AuditGroup] = {}
    hits: dict[tuple[str, str | None, str], list[_Divergence]] = {}
    skipped = tokens = 0
    for start in range(0, len(kept), _BATCH):
        batch = []
        for n, record in enumerate(kept[start: start + _BATCH], start):
            try:
                batch.append((n, record, *render(record, tokenizer, limits.max_prompt_chars)))
            except (ValueError, ChatFormatError, TypeError):
                skipped += 1
        encoded = tokenizer.encode_with_ends([text for _, _, text, _ in batch])
        for (n, record, text, messages), (ids, ends) in zip(batch, encoded, strict=True):
            prompt = AuditPrompt(n, text, ids, array("I", ends), messages)
            tokens += len(ids)
            group = groups.setdefault((record.model, record.tenant), AuditGroup())
            if group.prompts:
                for d in auditor.compare(group, prompt):
                    hits.setdefault((record.model, record.tenant, d.cause), []).append(d)
            group.add(prompt)
    return AuditReport(len(kept) - skipped, skipped, tokens, _findings(hits))


def _findings(hits: Mapping[tuple[str, str | None, str], Sequence[_Divergence]]
              ) -> tuple[Finding, ...]:
    """One finding per (model, tenant, cause), and for a value (timestamp, id, other) per
    place in the text where it starts."""
    by_site: dict[tuple[str, str | None, str, int], list[_Divergence]] = {}
    for (model, tenant, cause), found in hits.items():
        for d in found:
            by_site.setdefault((model, tenant, cause, d.site), []).append(d)
    findings = []
    for (model, tenant, cause, _), found in by_site.items():
        position = Counter(d.position for d in found).most_common(1)[0][0]
        example = next(d for d in found if d.position == position)
        affected = len({d.request for d in found})
        findings.append(Finding(cause, position, example.context, affected,
                                sum(d.tokens_lost for d in found), model, tenant,
                                example.needs))
    findings.sort(key=lambda f: -f.tokens_lost)
    return tuple(findings)
