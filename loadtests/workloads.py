"""Deterministic request streams for load tests and the offline simulator.

A prompt is a sequence of ``Segment``s (system prompt, document, tool schemas, user and
assistant turns). Two requests share a cached prefix exactly when they share their leading
segments, because a segment's content is a pure function of ``(workload seed, key)``:

* ``token_ids()`` gives synthetic token ids for the simulator (no tokenizer involved);
  shared segments are generated once and kept, so 40,000 questions about 2,000 documents
  do not regenerate 6,000-token documents.
* ``messages()`` gives OpenAI chat messages whose text is drawn from the project word list,
  sized so that the project tokenizer yields about ``segment.length`` tokens.

Workloads (all deterministic from ``seed``):

* ``contracts``: a document library with a hot set receiving ``hot_fraction`` of questions,
  popularity inside each set uniform or Zipf, optional shared system prompt.
* ``chat``: multi-turn conversations whose history only grows (each turn extends the last).
* ``tools``: one system prompt, several tool-schema blocks under it, conversations under
  each block: a branching tree of shared prefixes.
* ``chat-apps``: several apps, each with its own system prompt and tool schemas (sent in
  the request's ``tools`` field), taking shares of the conversations; conversations of
  1-12 turns arrive as a Poisson process and each turn follows the last after a think
  time, carrying the whole history. Requests carry their arrival times.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

ID_LOW, ID_HIGH = 3, 4096  # synthetic ids stay inside the project tokenizer's vocabulary
TEXT_TOKENS_PER_WORD = 1.94  # measured: project tokenizer on word-list text
_IDS = tuple(range(ID_LOW, ID_HIGH))


@dataclass(frozen=True, slots=True)
class Segment:
    """One piece of a prompt; equal keys (in one workload) mean equal content."""

    key: str
    length: int
    role: Literal["system", "user", "assistant", "tools"]  # tools: the request's field
    shared: bool


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    """One request: its prompt segments, its answer length and labels for reports."""

    index: int
    segments: tuple[Segment, ...]
    max_tokens: int
    label: str  # "hot" / "cold" for contracts, the workload name otherwise
    affinity_key: str
    content: SegmentContent = field(repr=False, compare=False)
    arrival_s: float | None = None  # seconds from the start, for workloads that time turns

    @property
    def prompt_tokens(self) -> int:
        return sum(s.length for s in self.segments)

    def shared_segments(self) -> tuple[Segment, ...]:
        """The leading shared segments (system prompt, document, earlier turns)."""
        out = []
        for seg in self.segments:
            if not seg.shared:
                break
            out.append(seg)
        return tuple(out)

    def token_ids(self) -> list[int]:
        return self.content.token_ids(self.segments)

    def messages(self) -> list[dict[str, str]]:
        return self.content.messages(self.segments)

    def tools(self) -> list[dict[str, Any]] | None:
        return self.content.tools(self.segments)


class SegmentContent:
    """Token ids and text of segments, derived from ``(seed, key)`` and memoized if shared."""

    def __init__(self, seed: int, tokens_per_word: float = TEXT_TOKENS_PER_WORD) -> None:
        self.seed = seed
        self.tokens_per_word = tokens_per_word
        self._ids: dict[str, list[int]] = {}
        self._text: dict[str, str] = {}

    def _rng_seed(self, key: str) -> int:
        digest = hashlib.blake2b(f"{self.seed}/{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def ids(self, segment: Segment) -> list[int]:
        cached = self._ids.get(segment.key)
        if cached is not None:
            return cached
        # Drawn from one table of int objects: a kept list costs 8 bytes per token.
        draws = np.random.default_rng(self._rng_seed(segment.key)).integers(
            0, len(_IDS), size=segment.length)
        ids = list(map(_IDS.__getitem__, draws.tolist()))
        if segment.shared:
            self._ids[segment.key] = ids
        return ids

    def text(self, segment: Segment) -> str:
        cached = self._text.get(segment.key)
        if cached is not None:
            return cached
        from kvwire.tokenizer_build import WORDS, sample_text

        rng = random.Random(self._rng_seed(segment.key))
        words = max(1, round(segment.length / self.tokens_per_word))
        # The key's own words first, so segments never share text by accident.
        text = f"{WORDS[rng.randrange(len(WORDS))]} {segment.key}: {sample_text(rng, words)}"
        if segment.shared:
            self._text[segment.key] = text
        return text

    def token_ids(self, segments: Sequence[Segment]) -> list[int]:
        out: list[int] = []
        for seg in segments:
            out += self.ids(seg)
        return out

    def tools(self, segments: Sequence[Segment]) -> list[dict[str, Any]] | None:
        """The ``tools`` field: each tools segment as function schemas whose descriptions
        carry its text (about ``segment.length`` tokens once rendered)."""
        out: list[dict[str, Any]] = []
        for seg in segments:
            if seg.role != "tools":
                continue
            words = self.text(seg).split(" ")
            per = max(1, len(words) // 4)
            for j in range(0, len(words), per):
                out.append({"type": "function", "function": {
                    "name": f"{seg.key}_{j // per}",
                    "description": " ".join(words[j : j + per]),
                    "parameters": {"type": "object", "properties": {
                        "query": {"type": "string"}}, "required": ["query"]}}})
        return out or None

    def messages(self, segments: Sequence[Segment]) -> list[dict[str, str]]:
        """Consecutive segments with one role become one message, joined by blank lines
        (tools segments go to the ``tools`` field instead)."""
        out: list[dict[str, str]] = []
        for seg in segments:
            if seg.role == "tools":
                continue
            text = self.text(seg)
            if out and out[-1]["role"] == seg.role:
                out[-1]["content"] += "\n\n" + text
            else:
                out.append({"role": seg.role, "content": text})
        return out


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not 0 < value < math.inf:  # NaN too
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def popularity(n: int, kind: str, zipf_s: float) -> np.ndarray:
    """Selection probabilities of ``n`` items: uniform, or Zipf with exponent ``zipf_s``."""
    if kind == "uniform":
        return np.full(n, 1.0 / n)
    if kind == "zipf":
        weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** zipf_s
        return weights / weights.sum()
    raise ValueError(f"popularity must be 'uniform' or 'zipf', got {kind!r}")


@dataclass(frozen=True, slots=True)
class ContractsSpec:
    """The contract library: documents ``[0, hot_docs)`` are the hot set."""

    num_docs: int = 2000
    doc_tokens: int = 6000
    doc_jitter: float = 0.05  # each document's length is doc_tokens x (1 +- jitter)
    hot_docs: int = 250
    hot_fraction: float = 0.8
    question_tokens: tuple[int, int] = (60, 100)
    output_tokens: tuple[int, int] = (16, 48)
    system_tokens: int = 0
    popularity: Literal["uniform", "zipf"] = "uniform"
    zipf_s: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        _check_positive(num_docs=self.num_docs, doc_tokens=self.doc_tokens,
                        hot_docs=self.hot_docs)
        if not self.hot_docs < self.num_docs:
            raise ValueError(f"hot_docs ({self.hot_docs}) must be < num_docs ({self.num_docs})")
        if not 0.0 <= self.hot_fraction <= 1.0:
            raise ValueError(f"hot_fraction must be in [0, 1], got {self.hot_fraction!r}")
        if not 0.0 <= self.doc_jitter < 1.0:
            raise ValueError(f"doc_jitter must be in [0, 1), got {self.doc_jitter!r}")
        _check_range("question_tokens", self.question_tokens)
        _check_range("output_tokens", self.output_tokens)
        popularity(1, self.popularity, self.zipf_s)

    def doc_length(self, doc: int) -> int:
        rng = random.Random(f"{self.seed}/doclen/{doc}")
        return max(16, round(self.doc_tokens * (1 + self.doc_jitter * (2 * rng.random() - 1))))


def _check_range(name: str, bounds: tuple[int, int]) -> None:
    lo, hi = bounds
    if not 1 <= lo <= hi:
        raise ValueError(f"{name} must be [lo, hi] with 1 <= lo <= hi, got {bounds!r}")


@dataclass(frozen=True, slots=True)
class ChatSpec:
    """Conversations of ``turns`` turns; ``active`` of them are in progress at any time."""

    active: int = 64
    turns: tuple[int, int] = (3, 10)
    user_tokens: tuple[int, int] = (30, 200)
    assistant_tokens: tuple[int, int] = (50, 300)
    output_tokens: tuple[int, int] = (16, 64)
    system_tokens: int = 300
    seed: int = 0

    def validate(self) -> None:
        _check_positive(active=self.active)
        for name in ("turns", "user_tokens", "assistant_tokens", "output_tokens"):
            _check_range(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class ToolsSpec:
    """``system`` -> ``toolsets`` schema blocks -> conversations under each block."""

    system_tokens: int = 800
    toolsets: int = 12
    tool_tokens: int = 2500
    active: int = 48
    turns: tuple[int, int] = (1, 6)
    user_tokens: tuple[int, int] = (40, 300)
    assistant_tokens: tuple[int, int] = (30, 200)
    output_tokens: tuple[int, int] = (16, 64)
    seed: int = 0

    def validate(self) -> None:
        _check_positive(system_tokens=self.system_tokens, toolsets=self.toolsets,
                        tool_tokens=self.tool_tokens, active=self.active)
        for name in ("turns", "user_tokens", "assistant_tokens", "output_tokens"):
            _check_range(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class ChatAppsSpec:
    """Apps with their own system prompt and tools; ``app_shares`` of the conversations
    each. Conversations start at ``rate / mean turns`` per second (so requests arrive at
    about ``rate``), have ``turns`` turns drawn geometric with mean ``mean_turns``, and a
    turn follows the previous one after an exponential think time of mean ``think_s``."""

    app_shares: tuple[float, ...] = (0.5, 0.25, 0.15, 0.1)
    system_tokens: tuple[int, int] = (500, 800)
    tool_tokens: tuple[int, int] = (400, 800)
    turns: tuple[int, int] = (1, 12)
    mean_turns: float = 3.2
    think_s: float = 8.0
    rate: float = 10.0
    user_tokens: tuple[int, int] = (30, 200)
    assistant_tokens: tuple[int, int] = (50, 300)
    output_tokens: tuple[int, int] = (16, 64)
    seed: int = 0

    def validate(self) -> None:
        if not self.app_shares or any(s <= 0 for s in self.app_shares):
            raise ValueError(f"app_shares must be positive numbers, got {self.app_shares!r}")
        _check_positive(mean_turns=self.mean_turns, think_s=self.think_s, rate=self.rate)
        for name in ("system_tokens", "tool_tokens", "turns", "user_tokens",
                     "assistant_tokens", "output_tokens"):
            _check_range(name, getattr(self, name))
        if not self.turns[0] <= self.mean_turns <= self.turns[1]:
            raise ValueError(f"mean_turns {self.mean_turns!r} is outside turns {self.turns!r}")


@dataclass(frozen=True, slots=True)
class TemplatesSpec:
    """Prompt templates (a system prompt, few-shot examples) shared by every request that
    uses them, ``shares`` of the requests each, followed by a tail of the request's own:
    one template is an app whose every request shares its system prompt."""

    shares: tuple[float, ...] = (1.0,)
    template_tokens: tuple[int, int] = (2000, 2000)
    tail_tokens: tuple[int, int] = (50, 300)
    output_tokens: tuple[int, int] = (8, 16)
    seed: int = 0

    def validate(self) -> None:
        if not self.shares or not all(0 < s < math.inf for s in self.shares):
            raise ValueError(f"shares must be positive numbers, got {self.shares!r}")
        for name in ("template_tokens", "tail_tokens", "output_tokens"):
            _check_range(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class RagSpec:
    """Retrieval-augmented questions: a system prompt, then ``per_request`` chunks of a
    corpus of ``chunks`` drawn by Zipf popularity (``zipf_s``) in the order retrieval
    ranks them (no two requests' orders alike but by chance), then the question."""

    system_tokens: int = 600
    chunks: int = 2000
    chunk_tokens: tuple[int, int] = (250, 400)
    per_request: tuple[int, int] = (3, 5)
    zipf_s: float = 1.0
    question_tokens: tuple[int, int] = (20, 80)
    output_tokens: tuple[int, int] = (8, 16)
    seed: int = 0

    def validate(self) -> None:
        _check_positive(system_tokens=self.system_tokens, chunks=self.chunks,
                        zipf_s=self.zipf_s)
        for name in ("chunk_tokens", "per_request", "question_tokens", "output_tokens"):
            _check_range(name, getattr(self, name))
        if self.per_request[1] > self.chunks:
            raise ValueError(f"per_request {self.per_request!r} asks more than the "
                             f"{self.chunks} chunks")


Spec = ContractsSpec | ChatSpec | ToolsSpec | ChatAppsSpec | TemplatesSpec | RagSpec
SPECS: dict[str, type[Spec]] = {"contracts": ContractsSpec, "chat": ChatSpec, "tools": ToolsSpec,
                                "chat-apps": ChatAppsSpec, "templates": TemplatesSpec,
                                "rag": RagSpec}


def _ints(rng: np.random.Generator, bounds: tuple[int, int], n: int) -> list[int]:
    return rng.integers(bounds[0], bounds[1] + 1, n).tolist()


def contracts(spec: ContractsSpec, n: int, content: SegmentContent) -> list[WorkloadRequest]:
    rng = np.random.default_rng([spec.seed, 1])
    cold_docs = spec.num_docs - spec.hot_docs
    hot = rng.random(n) < spec.hot_fraction
    hot_pick = rng.choice(spec.hot_docs, n, p=popularity(spec.hot_docs, spec.popularity,
                                                           spec.zipf_s))
    cold_pick = spec.hot_docs + rng.choice(cold_docs, n, p=popularity(
        cold_docs, spec.popularity, spec.zipf_s))
    docs = np.where(hot, hot_pick, cold_pick).tolist()
    questions = _ints(rng, spec.question_tokens, n)
    outputs = _ints(rng, spec.output_tokens, n)
    system = (Segment("system", spec.system_tokens, "system", True),) if spec.system_tokens else ()
    doc_segments: dict[int, Segment] = {}
    out = []
    for i in range(n):
        doc = docs[i]
        seg = doc_segments.get(doc)
        if seg is None:
            seg = doc_segments[doc] = Segment(f"doc{doc}", spec.doc_length(doc), "user", True)
        question = Segment(f"q{i}", questions[i], "user", False)
        out.append(WorkloadRequest(i, (*system, seg, question), outputs[i],
                                   "hot" if doc < spec.hot_docs else "cold", f"doc{doc}",
                                   content))
    return out


def _conversations(spec: ChatSpec | ToolsSpec, n: int, content: SegmentContent,
                   root: tuple[Segment, ...]) -> list[WorkloadRequest]:
    """Interleaved conversations; each request is the next turn of a random active one.

    A conversation's turn ``t`` prompt is ``root [+ toolset] + u0 a0 u1 a1 ... u_t``: it
    extends turn ``t - 1``'s prompt by that turn's synthetic answer and a new question.
    """
    rng = random.Random(f"{spec.seed}/conversations")
    label = "chat" if isinstance(spec, ChatSpec) else "tools"

    def start(conv: int) -> list:
        prefix = root
        if isinstance(spec, ToolsSpec):
            k = rng.randrange(spec.toolsets)
            prefix = (*root, Segment(f"tools{k}", spec.tool_tokens, "system", True))
        return [conv, prefix, rng.randint(*spec.turns), 0]

    active = [start(c) for c in range(spec.active)]
    next_conv = spec.active
    out = []
    for i in range(n):
        slot = rng.randrange(len(active))
        conv, prefix, turns, turn = active[slot]
        user = Segment(f"c{conv}u{turn}", rng.randint(*spec.user_tokens), "user", True)
        prompt = (*prefix, user)
        out.append(WorkloadRequest(i, prompt, rng.randint(*spec.output_tokens), label,
                                   f"conv{conv}", content))
        answer = Segment(f"c{conv}a{turn}", rng.randint(*spec.assistant_tokens),
                         "assistant", True)
        if turn + 1 < turns:
            active[slot] = [conv, (*prompt, answer), turns, turn + 1]
        else:
            active[slot] = start(next_conv)
            next_conv += 1
    return out


def _int(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def chat_apps(spec: ChatAppsSpec, n: int, content: SegmentContent) -> list[WorkloadRequest]:
    """The first ``n`` turns, by arrival time, of conversations over the apps."""
    rng = np.random.default_rng([spec.seed, 3])
    shares = np.asarray(spec.app_shares, dtype=np.float64)
    shares /= shares.sum()
    apps = []
    for a in range(len(shares)):
        system = Segment(f"app{a}-system", _int(rng, spec.system_tokens), "system", True)
        tools = Segment(f"app{a}-tools", _int(rng, spec.tool_tokens), "tools", True)
        apps.append((system, tools))
    lo, hi = spec.turns
    # geometric on [lo, hi] with the requested mean (truncation is ignored in the mean)
    p_stop = 1.0 / max(1.0, spec.mean_turns - lo + 1)
    starts = spec.rate / spec.mean_turns
    turn_times: list[tuple[float, int, int]] = []  # (arrival, conversation, turn)
    convs: list[tuple[int, int]] = []  # (app, turns)
    t = 0.0
    # enough conversations that their turns cover n requests, then take the first n: a
    # conversation not drawn yet starts after t, so the first n are known once the n-th
    # earliest turn is at or before t (at high rates the later turns of the last
    # conversations outnumber the 2n + 64 drawn)
    want = 2 * n + 64
    while True:
        while len(turn_times) < want:
            t += float(rng.exponential(1.0 / starts))
            app = int(rng.choice(len(shares), p=shares))
            turns = int(min(hi, lo + rng.geometric(p_stop) - 1))
            conv = len(convs)
            convs.append((app, turns))
            at = t
            for turn in range(turns):
                turn_times.append((at, conv, turn))
                at += float(rng.exponential(spec.think_s))
        turn_times.sort()
        if n == 0 or turn_times[n - 1][0] <= t:
            break
        want = len(turn_times) + n + 64
    prompts: dict[int, tuple[Segment, ...]] = {}
    out: list[WorkloadRequest] = []
    for at, conv, turn in turn_times[:n]:
        app, _ = convs[conv]
        prefix = prompts.get(conv, apps[app])
        user = Segment(f"c{conv}u{turn}", _int(rng, spec.user_tokens), "user", True)
        prompt = (*prefix, user)
        answer = Segment(f"c{conv}a{turn}", _int(rng, spec.assistant_tokens),
                         "assistant", True)
        prompts[conv] = (*prompt, answer)
        out.append(WorkloadRequest(len(out), prompt, _int(rng, spec.output_tokens), f"app{app}",
                                   f"conv{conv}", content, arrival_s=at))
    return out


def templates(spec: TemplatesSpec, n: int, content: SegmentContent) -> list[WorkloadRequest]:
    rng = np.random.default_rng([spec.seed, 5])
    shares = np.array(spec.shares, dtype=np.float64)
    picks = rng.choice(len(shares), n, p=shares / shares.sum()).tolist()
    lengths = _ints(rng, spec.template_tokens, len(shares))
    heads = [Segment(f"template{k}", length, "system", True) for k, length in enumerate(lengths)]
    tails = _ints(rng, spec.tail_tokens, n)
    outputs = _ints(rng, spec.output_tokens, n)
    return [WorkloadRequest(i, (heads[k], Segment(f"tail{i}", tails[i], "user", False)),
                            outputs[i], f"template{k}", f"template{k}", content)
            for i, k in enumerate(picks)]


def rag(spec: RagSpec, n: int, content: SegmentContent) -> list[WorkloadRequest]:
    rng = np.random.default_rng([spec.seed, 6])
    weights = popularity(spec.chunks, "zipf", spec.zipf_s)
    lengths = _ints(rng, spec.chunk_tokens, spec.chunks)
    system = Segment("system", spec.system_tokens, "system", True)
    out = []
    for i in range(n):
        k = _int(rng, spec.per_request)
        picks = rng.choice(spec.chunks, k, replace=False, p=weights).tolist()
        chunks = tuple(Segment(f"chunk{c}", lengths[c], "user", True) for c in picks)
        question = Segment(f"q{i}", _int(rng, spec.question_tokens), "user", False)
        out.append(WorkloadRequest(i, (system, *chunks, question),
                                   _int(rng, spec.output_tokens), "rag", f"chunk{picks[0]}",
                                   content))
    return out


def generate(spec: Spec, n: int, content: SegmentContent | None = None) -> list[WorkloadRequest]:
    """The first ``n`` requests of the workload ``spec`` describes (same spec, same list)."""
    spec.validate()
    content = content if content is not None else SegmentContent(spec.seed)
    if isinstance(spec, ContractsSpec):
        return contracts(spec, n, content)
    if isinstance(spec, ChatAppsSpec):
        return chat_apps(spec, n, content)
    if isinstance(spec, TemplatesSpec):
        return templates(spec, n, content)
    if isinstance(spec, RagSpec):
        return rag(spec, n, content)
    system = (Segment("system", spec.system_tokens, "system", True),) if spec.system_tokens else ()
    return _conversations(spec, n, content, system)


def build_spec(name: str, **params: object) -> Spec:
    """A workload spec by name, with ``params`` checked like a YAML mapping."""
    from policies.config import from_mapping

    try:
        cls = SPECS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r} (known: {', '.join(SPECS)})") from None
    return from_mapping(cls, params, where=f"workload {name}")
