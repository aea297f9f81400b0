"""The workload ``kvgate plan`` sizes: document numbers, a named scenario, or a capture.

Each becomes a ``Library`` for the arithmetic and a request stream for the simulator:

* numbers: the contract-library generator with those numbers (questions of 60-100
  tokens);
* a scenario (``loadtests.scenarios``): its own generator; a ``contracts`` scenario's
  library is read from its spec (its hot set getting ``hot_share`` of the questions), any
  other's is estimated from the prefixes its requests share (its hot set: the fewest
  documents that get ``hot_share``);
* a capture (the gateway's JSONL, one ``{"model", "body"}`` per line, ``body`` with
  ``prompt`` or ``messages``, or ``/generate``'s ``text`` or ``input_ids``): prompts are
  tokenized, documents estimated from shared prefixes (``shared_prefixes``), and each
  request replayed in order as its document followed by a tail of its own length. A line
  that gives no prompt (not JSON, not UTF-8, a body without a prompt or with a malformed
  chat, longer than ``max_line_bytes``: read past in pieces, never held whole) is skipped
  and counted, the first one's number and why kept (``SkippedLines``); a capture with no
  usable line is refused, naming the file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gateway.audit_cli import MAX_LINE_BYTES
from gateway.capture import CaptureRecord
from kvwire.bounded_lines import bounded_lines
from kvwire.tokenizer import PromptTokenizer
from loadtests.plan_arithmetic import Library
from loadtests.scenarios import SCENARIOS, Scenario
from loadtests.shared_prefixes import Estimate, Unit, block_units, estimate
from loadtests.workloads import (
    ChatAppsSpec,
    ContractsSpec,
    Segment,
    SegmentContent,
    WorkloadRequest,
    build_spec,
    generate,
)

RATE_PER_REPLICA = SCENARIOS["contracts"].rate / 8  # requests/s, the seed's library
_MIB = 1 << 20


@dataclass(slots=True)
class SkippedLines:
    """The lines of a capture that gave no prompt: how many, and the first one's number
    (from 1, blank lines counted) and why."""

    count: int = 0
    first_line: int | None = None
    first_reason: str | None = None

    def add(self, line: int, reason: str) -> None:
        if self.first_line is None:
            self.first_line, self.first_reason = line, reason
        self.count += 1

    def first(self) -> str:
        """The first skipped line, for a message: ``"line 7: why"`` (empty: none)."""
        return "" if self.first_line is None else f"line {self.first_line}: {self.first_reason}"


@dataclass(frozen=True, slots=True)
class PlanWorkload:
    source: str  # what it came from, for the report
    library: Library
    requests: tuple[WorkloadRequest, ...]  # for the simulator (may be empty)
    rate_per_replica: float  # requests/s
    scenario: Scenario | None = None
    estimated: bool = False  # the library was estimated from shared prefixes
    hot_docs_seen: int | None = None  # estimated: the hot set (library.hot_docs: at once)
    # a capture's lines without a usable prompt: how many, the first and why
    skipped: SkippedLines = field(default_factory=SkippedLines)


def from_numbers(docs: int, doc_tokens: int, hot: int, hot_share: float,
                 sim_requests: int, seed: int = 0) -> PlanWorkload:
    spec = ContractsSpec(num_docs=docs, doc_tokens=doc_tokens, hot_docs=hot,
                         hot_fraction=hot_share, seed=seed)
    return _contracts("documents", spec, sim_requests, RATE_PER_REPLICA, None)


def _contracts(source: str, spec: ContractsSpec, sim_requests: int, rate: float,
               scenario: Scenario | None) -> PlanWorkload:
    spec.validate()
    lo, hi = spec.question_tokens
    library = Library(docs=spec.num_docs, doc_tokens=spec.doc_tokens + spec.system_tokens,
                      hot_docs=spec.hot_docs, hot_share=spec.hot_fraction,
                      tail_tokens=(lo + hi) / 2)
    requests = tuple(generate(spec, sim_requests)) if sim_requests else ()
    return PlanWorkload(source, library, requests, rate, scenario)


def from_scenario(name: str, hot_share: float, sim_requests: int,
                  seed: int = 0, fleet_rate: float | None = None) -> PlanWorkload:
    """``hot_share``: the share of questions to a ``contracts`` scenario's hot set, or the
    share of requests the estimated hot set of any other scenario gets. ``fleet_rate``:
    the requests/s of a workload that times its own arrivals (default: the scenario's,
    for 8 replicas)."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}")
    scenario = SCENARIOS[name]
    spec = build_spec(scenario.workload, seed=seed, **scenario.params)
    rate = scenario.rate / 8
    if isinstance(spec, ContractsSpec):
        return _contracts(f"scenario {name}", replace(spec, hot_fraction=hot_share),
                          sim_requests, rate, scenario)
    if isinstance(spec, ChatAppsSpec):  # the workload times its own arrivals
        spec = replace(spec, rate=scenario.rate if fleet_rate is None else fleet_rate)
    requests = generate(spec, max(sim_requests, 2000))
    found = estimate([[(s.key, s.length) for s in r.segments] for r in requests], hot_share)
    # hot or cold by the estimated documents, for the hot prefill figures
    labelled = tuple(replace(r, label="hot" if shape.doc in found.hot else "cold")
                     for r, shape in zip(requests[:sim_requests], found.requests, strict=False))
    return PlanWorkload(f"scenario {name}", found.library, labelled, rate, scenario,
                        estimated=True, hot_docs_seen=len(found.hot))


def _prompts(body: Mapping[str, Any], tokenizer: PromptTokenizer) -> Iterator[list[int]]:
    prompt, messages = body.get("prompt"), body.get("messages")
    if prompt is None:  # SGLang's /generate
        prompt = body.get("text") if body.get("text") is not None else body.get("input_ids")
    if isinstance(messages, list) and messages:
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        yield tokenizer.encode(tokenizer.render_chat(messages, tools=tools))
    elif isinstance(prompt, str):
        yield tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        yield list(prompt)
    elif isinstance(prompt, list):  # a batch: several prompts, strings or token ids
        for item in prompt:
            if isinstance(item, str):
                yield tokenizer.encode(item)
            elif isinstance(item, list) and all(isinstance(t, int) for t in item):
                yield list(item)


def read_capture(path: str | Path, tokenizer: PromptTokenizer, limit: int | None = None,
                 max_line_bytes: int = MAX_LINE_BYTES,
                 skips: SkippedLines | None = None) -> tuple[list[list[int]], int]:
    """Token ids of the prompts in a capture (at most ``limit``), and the count of lines
    that gave none (see the module; counted, with the first, in ``skips``). Memory is
    bounded by ``limit`` and ``max_line_bytes``, however many lines are skipped."""
    prompts: list[list[int]] = []
    skips = SkippedLines() if skips is None else skips
    for number, line in bounded_lines(path, max_line_bytes):
        if line is None:
            skips.add(number, f"longer than {max_line_bytes / _MIB:g} MiB (--max-line-mb)")
            continue
        try:
            body = CaptureRecord.from_json(line).body  # the gateway's capture format
            # a chat the tokenizer's template refuses: ChatFormatError, a ValueError
            found = [ids for ids in _prompts(body, tokenizer) if ids]
        except ValueError as exc:  # orjson's decode error is one too
            skips.add(number, str(exc) or type(exc).__name__)
            continue
        if not found:  # none, or only empty ones ("prompt": "")
            skips.add(number, "no 'prompt', 'messages', 'text' or 'input_ids' with tokens")
        prompts.extend(found)
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        first = f"; the first, {skips.first()}" if skips.count else ""
        raise ValueError(f"{path}: no line has a 'body' with 'prompt', 'messages', 'text' "
                         f"or 'input_ids' ({skips.count} lines skipped{first})")
    return prompts[:limit], skips.count


def replay_requests(found: Estimate, content: SegmentContent,
                    output_tokens: int = 32) -> list[WorkloadRequest]:
    """The capture as simulator requests: each request's shared prefix as one segment per
    shared end down its path (requests sharing an end share those segments), then its own
    tail; labelled hot when its document is in the hot set."""
    out = []
    for i, shape in enumerate(found.requests):
        segments: list[Segment] = []
        depth = 0
        for end, end_depth in shape.prefix:  # [depth, end_depth)
            segments.append(Segment(f"p{end}", end_depth - depth, "user", True))
            depth = end_depth
        if shape.tail_tokens or not segments:
            segments.append(Segment(f"q{i}", max(1, shape.tail_tokens), "user", False))
        label = "hot" if shape.doc in found.hot else "cold"
        key = f"doc{shape.doc}" if shape.doc is not None else f"q{i}"
        out.append(WorkloadRequest(i, tuple(segments), output_tokens, label, key, content))
    return out


def from_capture(path: str | Path, tokenizer: PromptTokenizer, hot_share: float,
                 sim_requests: int, block_size: int = 16, seed: int = 0,
                 max_requests: int = 50_000,
                 max_line_bytes: int = MAX_LINE_BYTES) -> PlanWorkload:
    skips = SkippedLines()
    prompts, _ = read_capture(path, tokenizer, max_requests, max_line_bytes, skips)
    units: Sequence[Sequence[Unit]] = [block_units(ids, block_size) for ids in prompts]
    found = estimate(units, hot_share)
    requests = replay_requests(found, SegmentContent(seed))[:sim_requests]
    return PlanWorkload(f"capture {path} ({len(prompts)} prompts)", found.library,
                        tuple(requests), RATE_PER_REPLICA, None, estimated=True,
                        hot_docs_seen=len(found.hot), skipped=skips)
