"""From a parsed request to a routing decision: tokenize as far as the policy needs, then
ask the policy.

Tokenization runs in a small thread pool (HF ``tokenizers`` releases the GIL while
encoding), bounded by a semaphore so a burst of long prompts queues instead of piling
threads up; the event loop never encodes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

from engine.tokenizer import ChatFormatError, PromptTokenizer, normalize_messages
from gateway.errors import BadRequest, NoReplicaAvailable
from gateway.fleet import Fleet
from gateway.request_parse import ParsedRequest
from policies.base import Decision, NoReplicaError, Policy, ReplicaView, RouteRequest


class _Tokens(NamedTuple):
    ids: Sequence[int]  # the first tokens the policy asked for
    total: int  # prompt length (exact, or an estimate when only a prefix was encoded)
    anchor: int | None  # tokens a conversation's turns share (chats only)
    fingerprint: int | None  # identifies the whole prompt within this process


@dataclass(frozen=True, slots=True)
class Routing:
    request: RouteRequest
    decision: Decision
    views: list[ReplicaView]
    seconds: float


class Router:
    def __init__(self, policy: Policy, tokenizer: PromptTokenizer, fleet: Fleet,
                 concurrency: int) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.fleet = fleet
        self._pool = ThreadPoolExecutor(max_workers=min(concurrency, 4),
                                        thread_name_prefix="kvgate-tokenize")
        self._slots = asyncio.Semaphore(concurrency)
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid():x}-"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _tokenize(self, parsed: ParsedRequest, needed: int | None) -> _Tokens:
        if parsed.prompt_ids is not None:
            ids = parsed.prompt_ids
            return _Tokens(ids if needed is None else ids[:needed], len(ids), None,
                           hash(tuple(ids)))
        anchor = None
        if parsed.messages is not None:
            try:
                text = self.tokenizer.render_chat(parsed.messages)
                anchor = self._anchor(parsed.messages, text, needed)
            except ChatFormatError as exc:
                raise BadRequest(str(exc), param="messages") from exc
        else:
            assert parsed.prompt_text is not None
            text = parsed.prompt_text
        enc = self.tokenizer.encode_prefix(text, needed)
        return _Tokens(enc.ids, enc.total_estimate, anchor, hash(text))

    def _anchor(self, messages: list[Any], text: str, needed: int | None) -> int | None:
        """Tokens of the messages up to the first user message, when the rendered prompt
        starts with them (the part of a chat that every later turn repeats)."""
        first_user = next((i for i, m in enumerate(messages)
                           if isinstance(m, dict) and m.get("role") == "user"), None)
        if first_user is None:
            return None
        head = self.tokenizer.render_chat(messages[: first_user + 1],
                                          add_generation_prompt=False)
        if not text.startswith(head):
            return None  # a template that renders earlier messages differently later
        enc = self.tokenizer.encode_prefix(head, needed)
        return enc.total_estimate if enc.complete else None

    async def route_request(self, parsed: ParsedRequest, tenant: str | None) -> RouteRequest:
        needed = self.policy.tokens_needed
        if parsed.prompt_ids is not None or needed == 0:
            # Nothing to encode, or only a length estimate: no need to leave the loop.
            if parsed.prompt_ids is None:
                text = parsed.prompt_text if parsed.prompt_text is not None else "".join(
                    m["content"] for m in normalize_messages(parsed.messages or []))
                toks = _Tokens((), self.tokenizer.estimate_tokens(text), None, None)
            else:
                toks = self._tokenize(parsed, needed)
        elif parsed.prompt_text is not None and (
                hit := self.tokenizer.remembered_prefix(parsed.prompt_text, needed or 0)):
            # a repeated document: no thread hop
            toks = _Tokens(hit.ids, hit.total_estimate, None, hash(parsed.prompt_text))
        else:
            async with self._slots:
                loop = asyncio.get_running_loop()
                toks = await loop.run_in_executor(self._pool, self._tokenize, parsed, needed)
        request_id = f"{self._id_prefix}{next(self._ids)}"
        return RouteRequest(tokens=toks.ids, prompt_tokens=toks.total, request_id=request_id,
                            model=parsed.model, tenant=tenant, cache_salt=parsed.cache_salt,
                            affinity_key=parsed.affinity_key, anchor_tokens=toks.anchor,
                            fingerprint=toks.fingerprint)

    async def decide(self, parsed: ParsedRequest, tenant: str | None = None) -> Routing:
        started = time.perf_counter()
        request = await self.route_request(parsed, tenant)
        views = self.fleet.views(parsed.model)
        try:
            decision = self.policy.choose(request, views)
        except NoReplicaError as exc:
            raise NoReplicaAvailable(f"no healthy replica for model {parsed.model!r}: {exc}") \
                from exc
        return Routing(request, decision, views, time.perf_counter() - started)
