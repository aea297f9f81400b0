"""Synthetic request logs for the prompt-layout audit: each with one cause of lost prefix
sharing planted, and a clean one. Records are the capture log's JSON objects
(``{"ts", "model", "tenant", "endpoint", "body"}``); the stable parts are returned too, so
tests can work out independently what a fix would save."""

from __future__ import annotations

import itertools
import json
import random
import uuid
from dataclasses import dataclass
from typing import Any

from kvwire.tokenizer_build import sample_text

MODEL = "sim-llama"
_TOOL_NAMES = ("search_contracts", "get_clause", "compare_terms")


@dataclass(frozen=True, slots=True)
class PlantedLog:
    records: list[dict[str, Any]]
    fixed: list[dict[str, Any]]  # the same requests laid out well (the planted cause gone)
    planted: list[str]  # per request, the text of what was planted ("" if nothing)


def _record(i: int, body: dict[str, Any], tenant: str | None = "acme") -> dict[str, Any]:
    endpoint = "chat" if "messages" in body else "completions"
    return {"ts": 1764547200.0 + i, "model": MODEL, "tenant": tenant, "endpoint": endpoint,
            "body": {"model": MODEL, **body}}


def _chat(system: str, user: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}], "max_tokens": 8, **extra}


def questions(rng: random.Random, n: int) -> list[str]:
    return [f"Question {i}: {sample_text(rng, 12)}?" for i in range(n)]


def system_parts(rng: random.Random) -> tuple[str, str]:
    head = "You are a contracts assistant for the legal team. "
    tail = sample_text(rng, 120) + "\nAnswer briefly and cite the clause.\n"
    return head, tail


def timestamp_log(n: int = 12, seed: int = 1) -> PlantedLog:
    rng = random.Random(seed)
    head, tail = system_parts(rng)
    before, after = head + "Current time: ", ". " + tail
    records, fixed, stamps = [], [], []
    for i, q in enumerate(questions(rng, n)):
        stamps.append(f"2026-12-01 10:{i * 7 % 60:02d}:{i * 13 % 60:02d}")
        records.append(_record(i, _chat(before + stamps[-1] + after, q)))
        fixed.append(_record(i, _chat(before + after, q)))  # the time moved out
    return PlantedLog(records, fixed, stamps)


def uuid_log(n: int = 12, seed: int = 2) -> PlantedLog:
    rng = random.Random(seed)
    head, tail = system_parts(rng)
    before, after = head + "Request id: ", "\n" + tail
    ids = random.Random(seed)
    planted = [str(uuid.UUID(int=ids.getrandbits(128))) for _ in range(n)]
    asked = questions(rng, n)
    records = [_record(i, _chat(before + planted[i] + after, q)) for i, q in enumerate(asked)]
    fixed = [_record(i, _chat(before + after, q)) for i, q in enumerate(asked)]
    return PlantedLog(records, fixed, planted)


def tools(order: int) -> list[dict[str, Any]]:
    """The same three tool schemas, their keys written in one of 12 orders (``order``
    0-11; each a different text)."""
    perms = list(itertools.permutations(range(3)))
    made = []
    for k, name in enumerate(_TOOL_NAMES):
        params = {"type": "object", "properties": {
            "query": {"type": "string", "description": f"what to look for in {name}"},
            "limit": {"type": "integer", "description": "how many results to return"}},
            "required": ["query"]}
        function = {"name": name, "description": f"Tool {k}: {name.replace('_', ' ')}",
                    "parameters": params}
        keys = list(function)
        function = {keys[j]: function[keys[j]] for j in perms[(order // 2 + k) % 6]}
        made.append({"type": "function", "function": function} if order % 2 == 0
                    else {"function": function, "type": "function"})
    return made


def json_key_order_log(n: int = 12, seed: int = 3) -> PlantedLog:
    rng = random.Random(seed)
    head, tail = system_parts(rng)
    asked = questions(rng, n)
    records = [_record(i, _chat(head + tail, q, tools=tools(i))) for i, q in enumerate(asked)]
    fixed = [_record(i, _chat(head + tail, q, tools=tools(0))) for i, q in enumerate(asked)]
    listed = ["\n".join(json.dumps(t) for t in tools(i)) for i in range(n)]  # as rendered
    return PlantedLog(records, fixed, listed)


def chunks(seed: int = 4, count: int = 4) -> list[str]:
    rng = random.Random(seed)
    return [f"[doc {k}] " + sample_text(rng, 60) for k in range(count)]


def chunk_order_log(n: int = 12, seed: int = 4) -> PlantedLog:
    rng = random.Random(seed)
    head, tail = system_parts(rng)
    docs = chunks(seed)
    orders = list(itertools.permutations(docs))
    random.Random(seed).shuffle(orders)
    records, fixed, planted = [], [], []
    for i, q in enumerate(questions(rng, n)):
        planted.append("\n\n".join(orders[i]))
        records.append(_record(i, _chat(head + tail, f"Context:\n\n{planted[-1]}\n\n{q}")))
        fixed.append(_record(i, _chat(head + tail,
                                      "Context:\n\n" + "\n\n".join(docs) + "\n\n" + q)))
    return PlantedLog(records, fixed, planted)


def history_rewrite_log(conversations: int = 6, seed: int = 5) -> PlantedLog:
    """Three turns per conversation; the third resends the first answer shortened (its
    reasoning dropped), as some chat templates do."""
    rng = random.Random(seed)
    head, tail = system_parts(rng)
    system = head + tail
    records: list[dict[str, Any]] = []
    fixed: list[dict[str, Any]] = []
    planted: list[str] = []
    for c in range(conversations):
        u1, u2, u3 = (f"Conversation {c} turn {t}: {sample_text(rng, 15)}?" for t in range(3))
        reasoning = "Reasoning: " + sample_text(rng, 60) + "\n"
        a1 = reasoning + "Answer: " + sample_text(rng, 20)
        a2 = "Answer: " + sample_text(rng, 25)
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": u1}]
        msgs2 = [*msgs, {"role": "assistant", "content": a1}, {"role": "user", "content": u2}]
        later = [{"role": "assistant", "content": a2}, {"role": "user", "content": u3}]
        shortened = [*msgs, {"role": "assistant", "content": a1[len(reasoning):]},
                     {"role": "user", "content": u2}, *later]
        for turn, good in ((msgs, msgs), (msgs2, msgs2), (shortened, [*msgs2, *later])):
            fixed.append(_record(len(records), {"messages": good}))
            records.append(_record(len(records), {"messages": turn}))
            planted.append(a1[len(reasoning):] if turn is shortened else "")
    return PlantedLog(records, fixed, planted)


def clean_log(seed: int = 6) -> list[dict[str, Any]]:
    """Traffic laid out well: a fixed system prompt and tools, questions after; documents
    with questions after; conversations whose turns repeat earlier ones exactly; two
    tenants sending the same prompts (never compared: separate caches)."""
    rng = random.Random(seed)
    head, tail = system_parts(rng)
    system = head + tail
    records: list[dict[str, Any]] = []
    for q in questions(rng, 8):
        records.append(_record(len(records), _chat(system, q, tools=tools(0))))
    docs = [sample_text(rng, 300) for _ in range(3)]
    for q in questions(rng, 6):
        records.append(_record(len(records), {"prompt": docs[len(records) % 3] + "\n" + q}))
    for c in range(4):
        msgs: list[dict[str, str]] = [{"role": "system", "content": system}]
        for t in range(3):
            msgs = [*msgs, {"role": "user", "content": f"Chat {c} turn {t}: "
                            f"{sample_text(rng, 15)}?"}]
            records.append(_record(len(records), {"messages": msgs}))
            msgs = [*msgs, {"role": "assistant", "content": sample_text(rng, 30)}]
    for tenant in ("t1", "t2"):
        records.append(_record(len(records), _chat(system, "Same question?"), tenant))
    return records
