"""From a parsed request to a routing decision: tokenize as far as the policy needs, then
ask the policy.

Tokenization runs in a small thread pool (HF ``tokenizers`` releases the GIL while
encoding), bounded by a semaphore so a burst of long prompts queues instead of piling
threads up; the event loop never encodes. A small chat that the policy only hashes in
pieces, or only estimates (no token ids), is read on the loop: that costs less than the
pool's round trip.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.errors import NoReplicaAvailable
from gateway.fleet import Fleet
from gateway.head_anchors import HeadAnchors
from gateway.request_parse import ParsedRequest
from gateway.tenancy import partition_views
from gateway.tracing import NO_TRACE, RequestTrace
from kvwire.chat_messages import ChatFormatError, normalize_messages
from kvwire.chat_template import TemplateRefused
from kvwire.media_parts import shown
from kvwire.openai_schema import MODEL_SHOWN_CHARS, BadRequest, optional
from kvwire.template_kwargs import TemplateKwargsError, request_template_kwargs
from kvwire.tokenizer import PrefixEncoding, PromptTokenizer
from policies.base import Decision, NoReplicaError, Policy, ReplicaView, RouteRequest
from policies.prompt_chunks import IDS_PER_CHUNK, ChunkMemo, id_chunks


class _Tokens(NamedTuple):
    ids: Sequence[int]  # the first tokens the policy asked for
    total: int  # prompt length (exact, or an estimate when only a prefix was encoded)
    anchor: int | None  # tokens a conversation's turns share (chats only)
    fingerprint: int | None  # identifies the whole prompt within this process
    chunks: Sequence[int] = ()  # prompt chunk hashes, for policies that asked
    chunk_tokens: float = 0.0
    anchor_chunks: int | None = None  # the anchor in chunks, for a policy that asked


# a chat within all four bounds is rendered and chunk-hashed, or its length estimated, on
# the event loop when the policy needs no token ids: rendering costs per byte (~50 us for
# 7 KB in one message), per message (~2 us), per content part (~1-2 us: 64 KB holds 20,000
# ``{}``) and per tool (~20 us), so each is bounded (at most ~0.5 ms, where the pool's
# round trip costs ~0.1 ms). A larger chat, or one to encode, goes to the pool
INLINE_CHAT_BYTES = 64 * 1024
INLINE_CHAT_MESSAGES = 64
INLINE_CHAT_PARTS = 256
INLINE_CHAT_TOOLS = 8


def _inline_chat(parsed: ParsedRequest) -> bool:
    """Whether reading ``parsed``'s chat (rendering it, or estimating its length) is cheap
    enough for the event loop."""
    messages = parsed.messages or ()
    return parsed.raw_bytes is not None and parsed.raw_bytes <= INLINE_CHAT_BYTES \
        and len(messages) <= INLINE_CHAT_MESSAGES \
        and len(parsed.tools or ()) <= INLINE_CHAT_TOOLS \
        and sum(len(c) for m in messages if isinstance(m, Mapping)
                and isinstance(c := m.get("content"), list)) <= INLINE_CHAT_PARTS


def _template_kwargs(parsed: ParsedRequest) -> dict[str, Any] | None:
    """The chat's template variables (its ``documents`` and ``chat_template_kwargs``),
    which the replica's template renders with (checked when the body was parsed; a body
    built otherwise, the simulator's, is checked here)."""
    if parsed.messages is None:
        return None
    try:
        return request_template_kwargs(parsed.body)
    except TemplateKwargsError as exc:
        raise BadRequest(str(exc), param=exc.param) from exc


def _turn_field(body: Mapping[str, Any], key: str, default: bool) -> bool:
    """A chat's ``add_generation_prompt`` or ``continue_final_message`` as the engine and
    vLLM read it (``optional``'s lax booleans: "no", 0 and "false" false; "yes", 1 and
    "true" true); a value that reads as no boolean is rendered as if absent, for the
    replica to refuse."""
    try:
        return bool(optional(body, key, bool, default))
    except BadRequest:
        return default


@dataclass(frozen=True, slots=True)
class Routing:
    """A decision, the request it was made for, the fleet snapshot it was made on (for
    ``Routed``) and how long it took."""

    request: RouteRequest
    decision: Decision
    seconds: float
    views: Sequence[ReplicaView] = ()
    pooled: bool = False  # built on the tokenizer pool (see Router._route)


def work_tokens(request: RouteRequest, decision: Decision, replica: str) -> int:
    """Prompt tokens ``replica`` will have to prefill for ``request``: all of them, less
    what the decision predicts it holds. Counted as that replica's pending work until
    its first byte, so a replica answering cached prompts does not look busy."""
    for score in decision.scores:
        if score.replica == replica:
            return max(1, request.prompt_tokens - score.matched_tokens)
    return request.prompt_tokens


class Router:
    def __init__(self, policy: Policy, tokenizer: PromptTokenizer, fleet: Fleet,
                 concurrency: int) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.fleet = fleet
        # called just before each decision of the policy, after the prompt was tokenized
        # (maybe on the pool, for a while): a worker's catch-up on the routes its box's
        # other workers told (``WorkerRoutes.catch_up``)
        self.before_choose: Callable[[], None] | None = None
        self._pool = ThreadPoolExecutor(max_workers=min(concurrency, 4),
                                        thread_name_prefix="kvgate-tokenize")
        self._slots = asyncio.Semaphore(concurrency)
        self._ids = itertools.count()
        # random per process: ids unique across gateway copies and restarts (a replica
        # refuses an id it is already running; every container's gateway is pid 1)
        self._id_prefix = f"{secrets.token_hex(6)}-"
        self._anchors = HeadAnchors()  # a conversation's later turns repeat its head
        self._chunk_memo: ChunkMemo | None = None  # made for the policy's chunk_chars

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _messages(parsed: ParsedRequest) -> list[dict[str, str]] | None:
        """A chat's messages normalized once (media parts hashed into their placeholders),
        so that rendering the whole chat and its head reads each part once."""
        if parsed.messages is None or parsed.prompt_text is not None:
            return None
        try:
            return normalize_messages(parsed.messages, lenient=True)
        except ChatFormatError as exc:
            raise BadRequest(str(exc), param=exc.param or "messages") from exc

    def _render(self, parsed: ParsedRequest, messages: list[dict[str, str]] | None) -> str:
        """The prompt text: the completion's prompt, or the chat (``messages``, from
        ``_messages``) rendered with its tools, as the replica renders it: its final
        assistant message left open with ``continue_final_message``, no assistant header
        with ``add_generation_prompt: false`` (vLLM's fields; a pair the replica would
        refuse, or a final message that cannot be continued, is rendered as a plain chat
        and left to the replica to judge).

        A chat the gateway's chat template refuses (``TemplateRefused``: roles out of the
        order it takes, a system turn) is rendered in the built-in layout: the gateway's
        tokenizer may not be the replica's, whose template judges the chat. A chat refused
        whatever the template (a malformed message, a value nested too deeply) is a 400."""
        if parsed.prompt_text is not None:
            return parsed.prompt_text
        variables = _template_kwargs(parsed)
        try:
            try:
                return self._rendered(parsed, messages or [], variables, False)
            except TemplateRefused:
                return self._rendered(parsed, messages or [], variables, True)
        except ChatFormatError as exc:  # the field named, where rendering tells it
            raise BadRequest(str(exc), param=exc.param or "messages") from exc

    def _rendered(self, parsed: ParsedRequest, messages: list[dict[str, str]],
                  variables: dict[str, Any] | None, builtin_layout: bool) -> str:
        """``_render``'s chat, with the tokenizer's template or in the built-in layout."""
        body = parsed.body
        if _turn_field(body, "continue_final_message", False) and messages \
                and messages[-1].get("role") == "assistant":
            try:
                return self.tokenizer.render_chat(messages, tools=parsed.tools,
                                                  add_generation_prompt=False,
                                                  continue_final_message=True,
                                                  template_kwargs=variables,
                                                  builtin_layout=builtin_layout)
            except ChatFormatError:
                pass
        return self.tokenizer.render_chat(
            messages, tools=parsed.tools,
            add_generation_prompt=_turn_field(body, "add_generation_prompt", True),
            template_kwargs=variables, builtin_layout=builtin_layout)

    def _tokenize(self, parsed: ParsedRequest, needed: int | None, text: str | None = None,
                  messages: list[dict[str, str]] | None = None) -> _Tokens:
        """``text`` and ``messages``: the prompt already rendered, and its messages."""
        if parsed.prompt_ids is not None:
            ids = parsed.prompt_ids
            return _Tokens(ids if needed is None else ids[:needed], len(ids), None,
                           hash(tuple(ids)) if self.policy.wants_fingerprint else None)
        if text is None:
            messages = self._messages(parsed)
            text = self._render(parsed, messages)
        anchor = None
        head = self._head(messages, text, parsed.tools, _template_kwargs(parsed)) \
            if messages is not None else None
        group = parsed.cache_salt or ""
        if head is not None:
            def count(head: str = head) -> int | None:
                enc = self.tokenizer.encode_prefix(head, needed, group)
                return enc.total_estimate if enc.complete else None
            anchor = self._anchors.anchor(head, needed, group, count)
        enc = self.tokenizer.encode_prefix(text, needed, group)
        if messages is None:
            return self._text_prompt(enc, needed, text)
        return _Tokens(enc.ids, enc.total_estimate, anchor, self._print(text))

    def _print(self, text: str) -> int | None:
        """The prompt's fingerprint, for a policy that reads it: hashing a 27 KB prompt
        costs ~5 us, a few % of a proxied request's CPU."""
        return hash(text) if self.policy.wants_fingerprint else None

    def _text_prompt(self, enc: PrefixEncoding, needed: int | None, text: str) -> _Tokens:
        """A text prompt's tokens as the engines (vLLM, SGLang) encode it: inside the
        tokenizer's special tokens (a Llama's BOS first), which its KV blocks' ids hold."""
        tok = self.tokenizer
        ends = len(tok.text_prefix_ids) + len(tok.text_suffix_ids)
        if not ends:
            return _Tokens(enc.ids, enc.total_estimate, None, self._print(text))
        ids = tok.prompt_ids(enc.ids) if enc.complete else [*tok.text_prefix_ids, *enc.ids]
        return _Tokens(ids if needed is None else ids[:needed], enc.total_estimate + ends,
                       None, self._print(text))

    def _head(self, messages: list[dict[str, str]], text: str,
              tools: list[Any] | None, variables: dict[str, Any] | None = None
              ) -> str | None:
        """The rendered tools and messages up to the first user message, when the prompt
        starts with them (the part of a chat that every later turn repeats)."""
        first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
        if first_user is None:
            return None
        try:
            head = self.tokenizer.render_chat(messages[: first_user + 1],
                                              add_generation_prompt=False, tools=tools,
                                              template_kwargs=variables)
        except ChatFormatError:  # a template that takes the whole chat but not its head
            return None
        if not text.startswith(head):
            return None  # a template that renders earlier messages differently later
        return head

    def build(self, parsed: ParsedRequest, tenant: str | None = None,
              now: float | None = None) -> RouteRequest:
        """The ``RouteRequest`` for a parsed request, encoding on the calling thread: the
        one builder of routing requests, for the gateway (``route_request`` runs it off the
        event loop, but for what costs microseconds) and the offline simulator alike."""
        return self._request(parsed, tenant, self._tokens(parsed, self.policy.tokens_needed),
                             now)

    def _tokens(self, parsed: ParsedRequest, needed: int | None) -> _Tokens:
        """The leading token ids the policy asked for, and the prompt's chunk hashes when
        it asks for them (a chat is rendered once for both)."""
        if self.policy.chunk_chars > 0 and parsed.messages is not None:
            messages = self._messages(parsed)
            text = self._render(parsed, messages)
            toks = _Tokens((), self.tokenizer.estimate_tokens(text), None, self._print(text)) \
                if needed == 0 else self._tokenize(parsed, needed, text, messages)
            if self.policy.wants_anchor and messages is not None:
                head = self._head(messages, text, parsed.tools, _template_kwargs(parsed))
                if head is not None:  # the whole chunks the head covers
                    toks = toks._replace(anchor_chunks=len(head) // self.policy.chunk_chars)
            return self._chunked(parsed, toks, text)
        return self._chunked(parsed, self._quick(parsed, needed)
                             or self._tokenize(parsed, needed))

    def _quick(self, parsed: ParsedRequest, needed: int | None) -> _Tokens | None:
        """The encoding when it costs microseconds (ids given, only a length estimate
        needed, or a remembered document); None when the prompt must be encoded. A chat's
        estimate reads every message and part: ``_route`` asks for it on the event loop
        only within the INLINE_CHAT_* bounds."""
        if parsed.prompt_ids is not None:
            return self._tokenize(parsed, needed)
        text = parsed.prompt_text
        if needed == 0:
            if text is not None:
                return _Tokens((), self.tokenizer.estimate_tokens(text), None, self._print(text))
            joined = "".join(m["content"] for m in normalize_messages(
                parsed.messages or [], hash_media=False, lenient=True))
            return _Tokens((), self.tokenizer.estimate_tokens(joined), None, None)
        group = parsed.cache_salt or ""  # no memo hit crosses tenants
        if text is not None and (hit := self.tokenizer.remembered_prefix(text, needed or 0,
                                                                         group)):
            return self._text_prompt(hit, needed, text)
        return None

    def _chunked(self, parsed: ParsedRequest, toks: _Tokens, text: str | None = None
                 ) -> _Tokens:
        """``toks`` with the prompt's chunk hashes (its first ``chunks_needed``), for a
        policy that asks for them."""
        chars = self.policy.chunk_chars
        if chars <= 0:
            return toks
        limit = self.policy.chunks_needed
        if parsed.prompt_ids is not None:
            ids = parsed.prompt_ids if limit is None else parsed.prompt_ids[
                : limit * IDS_PER_CHUNK]
            return toks._replace(chunks=id_chunks(ids), chunk_tokens=float(IDS_PER_CHUNK))
        text = self._render(parsed, self._messages(parsed)) if text is None else text
        if limit is not None:
            text = text[: limit * chars]
        memo = self._chunk_memo
        if memo is None or memo.chunk_chars != chars:
            memo = self._chunk_memo = ChunkMemo(chars)
        return toks._replace(chunks=memo.chunks(text, parsed.cache_salt or ""),
                             chunk_tokens=chars / self.tokenizer.chars_per_token)

    def _request(self, parsed: ParsedRequest, tenant: str | None, toks: _Tokens,
                 now: float | None) -> RouteRequest:
        request_id = f"{self._id_prefix}{next(self._ids)}"
        info = None if parsed.model is None else self.fleet.model_info(parsed.model)
        return RouteRequest(tokens=toks.ids, prompt_tokens=toks.total, request_id=request_id,
                            model=parsed.model, tenant=tenant, cache_salt=parsed.cache_salt,
                            affinity_key=parsed.affinity_key, anchor_tokens=toks.anchor,
                            fingerprint=toks.fingerprint,
                            arrival_s=time.monotonic() if now is None else now,
                            chunks=toks.chunks, chunk_tokens=toks.chunk_tokens,
                            anchor_chunks=toks.anchor_chunks,
                            base_model=None if info is None else info.parent)

    async def route_request(self, parsed: ParsedRequest, tenant: str | None) -> RouteRequest:
        return (await self._route(parsed, tenant))[0]

    async def _route(self, parsed: ParsedRequest, tenant: str | None
                     ) -> tuple[RouteRequest, bool]:
        """The request, and whether it was built on the tokenizer pool (encoded, or a
        large chat rendered there) rather than on the event loop."""
        now = time.monotonic()
        needed = self.policy.tokens_needed
        # cheap enough for the event loop: ids, a remembered document, a completion's
        # length estimate and chunk hashes (microseconds per KB), and a chat within the
        # INLINE_CHAT_* bounds estimated or rendered; a larger chat (its messages read one
        # by one: ~1 us each), or a prompt to encode, goes to the pool
        quick = None
        inline = parsed.messages is not None and _inline_chat(parsed)
        if parsed.messages is None or (self.policy.chunk_chars <= 0 and inline):
            quick = self._quick(parsed, needed)
        elif needed == 0 and inline:
            return self._request(parsed, tenant, self._tokens(parsed, needed), now), False
        if quick is not None:
            return self._request(parsed, tenant, self._chunked(parsed, quick), now), False
        async with self._slots:
            loop = asyncio.get_running_loop()
            toks = await loop.run_in_executor(self._pool, self._tokens, parsed, needed)
        return self._request(parsed, tenant, toks, now), True

    async def decide(self, parsed: ParsedRequest, tenant: str | None = None,
                     allowed: Callable[[str], bool] | None = None,
                     trace: RequestTrace = NO_TRACE, explain: bool = False) -> Routing:
        """The policy's decision over the fleet's replicas for the model (only those
        ``allowed``, when given: a tenant's partition), traced in ``trace``; with
        ``explain``, the one it would take (``Policy.explain``), for /admin/explain."""
        started = time.perf_counter()
        with trace.tokenize():
            request, pooled = await self._route(parsed, tenant)
            trace.tokenized(request)
        with trace.route():
            views = partition_views(self.fleet.views(parsed.model), allowed, tenant,
                                    parsed.model)
            if self.before_choose is not None:
                self.before_choose()
            try:
                decision = (self.policy.explain if explain else self.policy.choose)(
                    request, views)
            except NoReplicaError as exc:
                # the name's start only: before models are known any name gets here
                raise NoReplicaAvailable(f"no healthy replica for model "
                                         f"{shown(parsed.model, MODEL_SHOWN_CHARS)}: {exc}"
                                         ) from exc
            trace.routed(decision)
        return Routing(request, decision, time.perf_counter() - started, views, pooled)
