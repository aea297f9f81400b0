"""The engine's HTTP server: OpenAI completions and chat, SGLang's native generate,
vLLM's tokenize/reset/metrics.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/embeddings``
(:mod:`engine.embeddings`; executors that have an embedder), ``POST /invocations``
(SageMaker's, as vLLM's: one of those three by the body's shape,
:mod:`engine.invocations_route`), ``POST /generate``
(SGLang's native API, :mod:`engine.native_generate`) and SGLang's control endpoints
(``/abort_request``, ``/get_model_info``, ``/v1/loads``, ``/get_load``, ``/flush_cache``:
:mod:`engine.native_control`), ``GET /v1/models``, ``GET /health``, ``POST /tokenize``,
``POST /detokenize``, ``POST /reset_prefix_cache``, ``GET /metrics``, ``GET /version``.
Errors are ``{"error": {"message", "type", "param", "code"}}``. With an API key
(:mod:`engine.api_key`) every route but ``/health``, ``/version`` and ``/metrics`` needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from engine.api_key import ApiKeyGate
from engine.async_engine import AsyncEngine, EngineDeadError
from engine.core import EngineCore, StepOutput
from engine.embeddings import EmbeddingsRoute
from engine.generate_params import (
    GenerateParams,
    TooManyTokens,
    check_special_tokens,
    context_error,
    each_prompt,
    parse_generate,
    truncate_prompt,
    truncation_keep,
)
from engine.generation import AnswerStream, abort_unended
from engine.invocations_route import InvocationsRoute
from engine.metrics import EngineMetrics
from engine.native_control import ENGINE_VERSION, NativeControlRoutes
from engine.native_generate import NativeGenerateRoute
from engine.native_schema import input_too_long
from engine.openai_answer import OpenAIAnswer, OpenAIGeneration, child_params
from engine.request import RequestOutput, SamplingParams
from engine.responses_route import ResponsesRoute, StoreSettings
from engine.sim_embedding import SimEmbedder
from engine.text_stream import Decoder, SpecialKeeping, TextStream
from kvwire.media_parts import media_type, shown
from kvwire.openai_schema import (
    BadRequest,
    ClientDisconnected,
    ServiceUnavailable,
    check_served,
    model_field,
    optional,
)
from kvwire.request_edge import (
    ErrorBoundary,
    HeldBodyBytes,
    decoded_body,
    json_answer,
    parses_on_loop,
    read_body,
    unless_disconnected,
)

if TYPE_CHECKING:
    from engine.kv_event_publisher import KVEventPublisher

MAX_BODY_BYTES = 64 * 1024 * 1024
# the bytes of request bodies held at once, received or being decoded and checked, by
# default (``--max-held-body-bytes``): decoded, a body takes many times its bytes (a 64 MiB
# list of token ids, GiBs), and every request may send one at the same time
DEFAULT_MAX_HELD_BODY_BYTES = 4 * MAX_BODY_BYTES
# a request body comes whole within this (as the gateway's ``limits.body_timeout_s``), or is
# refused 408: a client that stops mid-body would hold its bytes of ``bodies`` for good
BODY_TIMEOUT_S = 60.0
T = TypeVar("T")
# Prompts (or inputs, in all) longer than this many characters are tokenized in a worker
# thread.
_INLINE_TOKENIZE_CHARS = 2000


def _renders_off_loop(messages: Sequence[Any], tools: Any) -> bool:
    """Whether rendering a chat is work for a worker thread: it has a media part (hashed
    whole), or its messages' texts and its tools' JSON run past
    ``_INLINE_TOKENIZE_CHARS``. One walk, stopping as soon as either is found."""
    chars = len(orjson.dumps(tools)) if tools else 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if media_type(part) is not None:
                    return True
                text = part.get("text") if isinstance(part, dict) else None
                chars += len(text) if isinstance(text, str) else 0
        if chars > _INLINE_TOKENIZE_CHARS:
            return True
    return chars > _INLINE_TOKENIZE_CHARS
# ``/tokenize`` counts this many times the model's context at most (and never fewer than
# TOKENIZE_FLOOR_TOKENS): vLLM's sets no bound, but a text is encoded whole to be counted, at
# some hundred bytes a token while it is, so a text proven longer is refused (400) unread
TOKENIZE_CONTEXTS = 4
TOKENIZE_FLOOR_TOKENS = 131_072
# ``/detokenize`` decodes a token list this many tokens at a time (``_detokenize``): the
# tokenizer holds the GIL while it decodes, and between pieces the event loop's thread
# (and the engine's step) runs. Whether the list is decoded on the loop or in a worker
# thread is ``json_answer``'s (``INLINE_ANSWER_ITEMS``), apart from this
_DECODE_PIECE_TOKENS = 2000


def _token_ids(tokens: list[Any]) -> list[int]:
    """``/detokenize``'s ``tokens`` read as vLLM's list of ints reads them (pydantic, lax,
    as ``optional`` reads an int field): ``3``, ``3.0`` or ``"3"`` is the id 3; a bool, a
    null, a fraction or other text is a BadRequest naming it."""
    if all(type(t) is int for t in tokens):
        return tokens
    ids: list[int] = []
    for token in tokens:
        try:
            read = None if token is None else optional({"tokens": token}, "tokens", int, None)
        except BadRequest:
            read = None
        if read is None:
            raise BadRequest("'tokens' must be a list of token ids (integers), got "
                             f"{shown(token)} in it", param="tokens")
        ids.append(read)
    return ids


def _check_in_all(encoded: Sequence[Sequence[int]], keep: int | None, in_all: int) -> None:
    """TooManyTokens (``in_all`` set) at the first of ``encoded`` whose tokens, each text's
    counted to ``keep``, take their sum past ``in_all``."""
    total = 0
    for i, ids in enumerate(encoded):
        total += len(ids) if keep is None else min(len(ids), keep)
        if total > in_all:
            raise TooManyTokens(i, total, in_all=True)


class EngineServer:
    """Owns the async engine, metrics and tokenizer of one served model."""

    def __init__(self, core: EngineCore, tokenizer: Any, *, model_name: str,
                 sleep_modeled_time: bool, kv_events: KVEventPublisher | None = None,
                 cache_config_info: bool = True,
                 embedder: SimEmbedder | None = None,
                 weight_version: str = "default",
                 max_held_body_bytes: int = DEFAULT_MAX_HELD_BODY_BYTES,
                 prompt_tokens_details: bool = True) -> None:
        """``embedder``: how this model embeds (``None``: ``/v1/embeddings`` answers 400);
        ``weight_version``: the version SGLang's ``meta_info.weight_version`` and
        ``/get_model_info`` name; ``max_held_body_bytes``: the bytes of request bodies
        :meth:`held_body` holds at once, all requests together (past it a 429; a body
        larger than it alone, a 413); ``prompt_tokens_details``: answers' usage tells the
        cached tokens (vLLM's only with ``--enable-prompt-tokens-details``)."""
        self.core = core
        self.prompt_tokens_details = prompt_tokens_details
        self.bodies = HeldBodyBytes(max_held_body_bytes, server="engine",
                                    setting="--max-held-body-bytes")
        self.body_timeout_s = BODY_TIMEOUT_S
        self.weight_version = weight_version
        self.embedder = embedder
        # The pool records KV events only when they are published; they are drained on
        # the loop thread between steps (after a step, or inside an engine call).
        self.kv_events = kv_events
        if kv_events is not None:
            core.kv.pool.events = []
        self.tokenizer = tokenizer
        # the ids a request may name: the tokenizer's, and no more than the model's
        # embedding rows (an executor running a model names them: ``vocab_size``); an id
        # past those would fail the step computing it, and every request batched with it
        model_vocab = getattr(core.executor, "vocab_size", None)
        self.vocab_size: int = tokenizer.vocab_size if model_vocab is None \
            else min(tokenizer.vocab_size, model_vocab)
        self.model_name = model_name
        self.max_model_len = core.config.max_model_len
        self.metrics = EngineMetrics(
            core, model_name, cache_config_info=cache_config_info,
            pace=(lambda: (self.engine.modeled_s, self.engine.late_s))
            if sleep_modeled_time else None,
            kv_events_dropped=(lambda: kv_events.dropped) if kv_events is not None else None)
        self.engine = AsyncEngine(core, sleep_modeled_time=sleep_modeled_time,
                                  on_step=self._observe)
        self.created = int(time.time())

    def _observe(self, out: StepOutput) -> None:
        self.metrics.observe_step(out, self.engine.clock())
        self._publish_kv_events()

    def stop_early(self, rid: str, reason: str, last: RequestOutput | None,
                   queue: asyncio.Queue[RequestOutput | BaseException] | None = None) -> None:
        """Abort a request the engine has not finished: the client left or an error
        (``abort``), or its text matched a stop string (``stop``); ``queue``: its outputs'
        (a request of the same id added since is left alone). On an engine whose loop
        is gone there is nothing to abort: it ended the request already."""
        with contextlib.suppress(EngineDeadError):
            self.engine.abort(rid, queue)
        self.metrics.ended_early(rid, reason, last, self.engine.clock())

    def decoder(self, skip_special_tokens: bool = True) -> Decoder:
        """The served tokenizer's decoder, or one that keeps special tokens' text."""
        return self.tokenizer if skip_special_tokens else SpecialKeeping(self.tokenizer)

    def _publish_kv_events(self) -> None:
        events = self.core.kv.pool.events
        if self.kv_events is not None and events:
            self.kv_events.publish(events)
            events.clear()

    def _reset_prefix_cache(self, core: EngineCore) -> int:
        dropped = core.reset_prefix_cache()
        self._publish_kv_events()  # an idle engine takes no step that would send it
        return dropped

    # -- helpers --------------------------------------------------------------------------

    async def read_json(self, request: HTTPRequest, parse: Callable[[Any], T],
                        max_body_bytes: int = MAX_BODY_BYTES) -> T:
        """``parse`` of the request's JSON body, on the event loop when the body is small
        (``parses_on_loop``), else decoded and parsed in a worker thread; a body of more
        containers or keys than a request may hold, or nested past ``MAX_NESTING`` levels
        (the engine writes some fields back), is refused (``decoded_body``). Its bytes
        count in ``bodies`` from their arrival until it is parsed (or refused)."""
        async with self.held_body(request, max_body_bytes) as raw:
            if parses_on_loop(raw):
                return parse(decoded_body(raw))
            return await asyncio.to_thread(lambda: parse(decoded_body(raw)))

    @contextlib.asynccontextmanager
    async def held_body(self, request: HTTPRequest, max_body_bytes: int = MAX_BODY_BYTES
                        ) -> AsyncIterator[bytes]:
        """The request's body, within ``max_body_bytes`` and ``body_timeout_s`` (408), its
        bytes counted in ``bodies`` from their arrival until the block ends: the body
        decoded and checked, or refused. The request keeps no copy after the block
        (``read_body`` leaves one for a later ``request.body()``, which no route makes),
        so a body's bytes live no longer than the caller holds them, not for as long as
        the request runs."""
        raw = await read_body(request, min(max_body_bytes, self.bodies.limit), self.bodies,
                              keep=True, timeout_s=self.body_timeout_s)
        try:
            yield raw
        finally:
            self.bodies.give(len(raw))
            vars(request).pop("_body", None)

    @property
    def max_tokenize_tokens(self) -> int:
        """The most tokens ``/tokenize`` counts (``TOKENIZE_CONTEXTS``)."""
        return max(TOKENIZE_CONTEXTS * self.max_model_len, TOKENIZE_FLOOR_TOKENS)

    async def encode_texts(self, texts: Sequence[str], for_model: bool = True, *,
                           field: str = "prompt", within: int | None = None,
                           keep: int | None = None, in_all: int | None = None
                           ) -> list[list[int]]:
        """The ids of each text: on the event loop when short, else in a worker thread.
        ``for_model``: the model computes them, so an id past its vocabulary (a tokenizer
        with more ids than the checkpoint's embedding rows) is a 400 naming ``field`` (the
        body's field the texts came in) here, not a step that fails every request batched
        with it.

        Bounded (``BoundedEncoder.encode_within``): ``within``, a text proven to encode to
        more than that many tokens is not encoded whole but raises TooManyTokens (a text
        not proven so is encoded whole, and its length is the caller's to check); ``keep``,
        each text's last ``keep`` tokens are given, read from its end (all of a short
        text's: the caller truncates); ``in_all`` (with ``within`` or ``keep``), the texts'
        tokens in all (each counted to ``keep``): encoding stops at the text that takes
        their sum past it, raising TooManyTokens with ``in_all`` set, so a batch of many
        texts is not encoded whole before its sum is known (a short batch, encoded on the
        event loop, is counted after)."""
        assert in_all is None or within is not None or keep is not None, \
            "encode_texts: in_all is kept only with within or keep"
        if sum(len(t) for t in texts) <= _INLINE_TOKENIZE_CHARS:
            encoded = self.tokenizer.encode_many(texts)  # a few hundred tokens at most
            if in_all is not None:
                _check_in_all(encoded, keep, in_all)
        else:
            encoded = await asyncio.to_thread(self._encode_bounded, texts, within, keep,
                                              in_all)
        limit = self.vocab_size
        if for_model and limit < self.tokenizer.vocab_size:
            for ids in encoded:
                bad = next((t for t in ids if t >= limit), None)
                if bad is not None:
                    raise BadRequest(
                        f"{field} encodes to token id {bad}, past the model's vocabulary "
                        f"[0, {limit}) (the tokenizer holds {self.tokenizer.vocab_size} ids)",
                        param=field)
        return encoded

    def _encode_bounded(self, texts: Sequence[str], within: int | None, keep: int | None,
                        in_all: int | None = None) -> list[list[int]]:
        """``encode_texts``' encoding, in a worker thread."""
        tok = self.tokenizer
        if keep is not None:
            out, total = [], 0
            for i, text in enumerate(texts):
                out.append(tok.bounded.encode_tail(text, keep))
                total += len(out[-1])  # encode_tail gives at most keep
                if in_all is not None and total > in_all:
                    raise TooManyTokens(i, total, in_all=True)
            return out
        if within is None:
            return list(tok.encode_many(texts))
        bounded = tok.bounded.encode_many_within(texts, within) if in_all is None \
            else tok.bounded.encode_many_in_all(texts, within, in_all)
        out, total = [], 0
        for i, got in enumerate(bounded):
            total += got.at_least
            if got.ids is None and got.at_least > within:
                raise TooManyTokens(i, got.at_least)
            if got.ids is None or (in_all is not None and total > in_all):
                # proven past the tokens ``in_all`` left, or encoded and past them
                raise TooManyTokens(i, total, in_all=True)
            out.append(got.ids)
        return out

    async def prompt_ids(self, p: GenerateParams, for_model: bool = True,
                         field: str = "prompt") -> list[int]:
        """The ids of ``p``'s prompt: given, a chat rendered, or a text encoded inside the
        tokenizer's special tokens (``field``: the body's field that an error names); a
        prompt proven longer than the model's context (``/tokenize``'s most, for it) is
        refused before it is encoded whole. Not truncated: with
        ``p.truncate_prompt_tokens`` (for the model, ``for_model``; not for
        ``/tokenize``) a text's last that many tokens are read from its end, so a long
        text's ids are those and its special tokens, given ids come as they are, and the
        caller cuts them to ``truncate_prompt_tokens`` (``truncate_prompt``)."""
        if p.prompt_ids is not None:
            return p.prompt_ids
        keep = truncation_keep(p.truncate_prompt_tokens, self.max_model_len) \
            if for_model else None
        if p.messages is not None:
            render = functools.partial(
                self.tokenizer.render_chat, p.messages, tools=p.tools,
                add_generation_prompt=p.add_generation_prompt,
                continue_final_message=p.continue_final_message,
                template_kwargs=p.chat_template_kwargs)
            try:
                # hashing media, or rendering a long chat: off the event loop
                if _renders_off_loop(p.messages, p.tools):
                    text = await asyncio.to_thread(render)
                else:
                    text = render()
            except ValueError as exc:  # a ChatFormatError names the field at fault
                raise BadRequest(str(exc), param=getattr(exc, "param", None) or "messages") \
                    from exc
        else:
            text = p.prompt_text or ""
        try:
            ids = (await self.encode_texts(
                [text], for_model, field=p.prompt_field, keep=keep,
                within=self.max_model_len if for_model else self.max_tokenize_tokens))[0]
        except TooManyTokens as exc:
            raise self._too_long(p, exc.at_least, None, for_model) from None
        if p.messages is None and ids:  # a text prompt: inside the tokenizer's special
            ids = self.tokenizer.prompt_ids(ids)  # tokens, as vLLM encodes it
        if not ids:
            raise BadRequest(f"{field} encodes to zero tokens", param=field)
        return ids

    async def each_prompt_ids(self, prompts: Sequence[GenerateParams],
                              field: str = "prompt") -> list[list[int]]:
        """Each prompt's ids: a chat's rendered, a batch's texts encoded in one call
        (``field``: the body's field that an error names), each bounded as ``prompt_ids``
        says and, like its, not yet cut to ``truncate_prompt_tokens`` (the caller's)."""
        if len(prompts) == 1:
            return [await self.prompt_ids(prompts[0], field=field)]
        keep = truncation_keep(prompts[0].truncate_prompt_tokens, self.max_model_len)
        at = [j for j, q in enumerate(prompts) if q.prompt_ids is None]
        texts = [prompts[j].prompt_text or "" for j in at]
        try:
            encoded = iter(await self.encode_texts(texts, field=field, keep=keep,
                                                   within=self.max_model_len)
                           if texts else ())
        except TooManyTokens as exc:
            j = at[exc.index]
            raise self._too_long(prompts[j], exc.at_least, j) from None
        out = [q.prompt_ids if q.prompt_ids is not None else next(encoded) for q in prompts]
        empty = next((j for j, ids in enumerate(out) if not ids), None)
        if empty is not None:
            raise BadRequest(f"{field} {empty} of the batch encodes to zero tokens",
                             param=field)
        # a text prompt inside the tokenizer's special tokens, as a lone one (prompt_ids)
        return [ids if q.prompt_ids is not None else self.tokenizer.prompt_ids(ids)
                for q, ids in zip(prompts, out, strict=True)]

    @property
    def _text_ends(self) -> int:
        """The special tokens a text prompt is encoded inside (a Llama's BOS)."""
        return len(self.tokenizer.text_prefix_ids) + len(self.tokenizer.text_suffix_ids)

    def _tokenize_too_long(self, field: str, at_least: int) -> BadRequest:
        """The refusal of a text past ``/tokenize``'s most, naming the bound that sets it:
        ``TOKENIZE_CONTEXTS`` contexts, or ``TOKENIZE_FLOOR_TOKENS`` where those are fewer."""
        contexts = TOKENIZE_CONTEXTS * self.max_model_len
        why = f"{TOKENIZE_CONTEXTS} times the model's maximum context length of " \
            f"{self.max_model_len} tokens" if contexts >= TOKENIZE_FLOOR_TOKENS else \
            f"the least it counts for any model; {TOKENIZE_CONTEXTS} times this model's " \
            f"maximum context length of {self.max_model_len} tokens is {contexts}"
        return BadRequest(
            f"{field} encodes to at least {at_least} tokens, more than the "
            f"{self.max_tokenize_tokens} /tokenize counts ({why})", param=field)

    def _too_long(self, p: GenerateParams, at_least: int, batch_index: int | None,
                  for_model: bool = True) -> BadRequest:
        """The refusal of ``p``'s prompt, whose text encodes to ``at_least`` tokens at
        least, more than the model's context (``/tokenize``'s most, ``for_model`` false),
        in the route's words: the count of the ids the model would see (a text prompt's
        inside the tokenizer's special tokens)."""
        if p.messages is None:
            at_least += self._text_ends
        if not for_model:
            return self._tokenize_too_long(p.prompt_field, at_least)
        if p.native:
            return input_too_long(at_least, self.max_model_len, p.prompt_field, at_least=True)
        answer = p.max_tokens if p.max_tokens is not None else 1
        return context_error(at_least, answer, self.max_model_len, p.chat, p.limit_param,
                             batch_index, prompt_field=p.prompt_field, at_least=True)

    # -- routes ---------------------------------------------------------------------------

    async def health(self, request: HTTPRequest) -> Response:
        return Response(status_code=200 if self.engine.alive else 503)

    async def models(self, request: HTTPRequest) -> Response:
        # vLLM's card: a base model has no parent; one permission entry, all defaults
        permission = {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                      "created": self.created, "allow_create_engine": False,
                      "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True,
                      "allow_fine_tuning": False, "organization": "*", "group": None,
                      "is_blocking": False}
        card = {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "kvgate", "root": self.model_name, "parent": None,
                "max_model_len": self.max_model_len, "permission": [permission]}
        return JSONResponse({"object": "list", "data": [card]})

    async def version(self, request: HTTPRequest) -> Response:
        return JSONResponse({"version": ENGINE_VERSION})

    async def metrics_route(self, request: HTTPRequest) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def tokenize(self, request: HTTPRequest) -> Response:
        strs, p = await self.read_json(request, self._parse_tokenize)
        if isinstance(p, str):  # inside the tokenizer's special tokens, as a completion's
            try:
                ids = (await self.encode_texts([p], for_model=False,
                                               within=self.max_tokenize_tokens))[0]
            except TooManyTokens as exc:
                raise self._tokenize_too_long("prompt", exc.at_least + self._text_ends) \
                    from None
            ids = self.tokenizer.prompt_ids(ids)
        else:
            ids = await self.prompt_ids(p, for_model=False)
        # spelt and written out at once: in one worker thread for many ids
        return await json_answer(lambda: {
            "count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
            # as vLLM's: null unless asked for
            "token_strs": self.tokenizer.token_strs(ids) if strs else None}, len(ids))

    def _parse_tokenize(self, body: Any) -> tuple[bool, GenerateParams | str]:
        """A ``/tokenize`` body, checked: whether it asks for the token strings, and its
        chat's parameters or its prompt."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        check_served(model_field(body), self.model_name)  # as vLLM: 404 for another model
        strs = bool(optional(body, "return_token_strs", bool, False))
        if "messages" in body:
            return strs, parse_generate({**body, "max_tokens": 1}, chat=True,
                                        model_name=self.model_name,
                                        vocab_size=self.vocab_size)
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string", param="prompt")
        check_special_tokens(body, chat=False)
        return strs, prompt

    async def detokenize(self, request: HTTPRequest) -> Response:
        tokens = await self.read_json(request, self._parse_detokenize)
        # checked, decoded and written out at once: in one worker thread for many ids
        return await json_answer(lambda: {"prompt": self._detokenize(tokens)}, len(tokens))

    def _parse_detokenize(self, body: Any) -> list[Any]:
        """A ``/detokenize`` body's ``tokens``, a list (its items checked by
        ``_detokenize``)."""
        if isinstance(body, dict):
            check_served(model_field(body), self.model_name)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list):
            raise BadRequest("'tokens' must be a list of token ids", param="tokens")
        return tokens

    def _detokenize(self, tokens: list[Any]) -> str:
        tokens = _token_ids(tokens)
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise BadRequest(f"'tokens' holds {bad}, outside the vocabulary [0, {vocab})",
                             param="tokens")
        if len(tokens) <= _DECODE_PIECE_TOKENS:  # one piece: one call, no stream
            return str(self.tokenizer.decode(tokens))
        # pieces [i, i + _DECODE_PIECE_TOKENS): a character whose bytes two pieces split
        # is held back by the stream until its end comes
        stream = TextStream(self.tokenizer)
        parts = [stream.push(tokens[i:i + _DECODE_PIECE_TOKENS])
                 for i in range(0, len(tokens), _DECODE_PIECE_TOKENS)]
        return "".join(parts) + stream.flush()

    async def reset_prefix_cache(self, request: HTTPRequest) -> Response:
        dropped = await self.engine.call(self._reset_prefix_cache)
        return JSONResponse({"status": "ok", "dropped_blocks": dropped})

    async def completions(self, request: HTTPRequest) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: HTTPRequest) -> Response:
        return await self._generate(request, chat=True)

    @property
    def max_request_tokens(self) -> int:
        """The most tokens, prompt and answer, one request may hold here: the context, or
        the KV cache where that is smaller (it could never hold more)."""
        return min(self.max_model_len,
                   self.core.config.num_blocks * self.core.config.block_size)

    async def submit(self, rid: str, ids: list[int], p: GenerateParams, max_tokens: int,
                     sequence: int = 0) -> asyncio.Queue[RequestOutput | BaseException]:
        """Queue one generation of ``max_tokens`` tokens at most on the engine (0: the
        prompt's prefill alone, as a pooling request) and count it in the metrics; its
        outputs arrive on the returned queue. ``sequence``: which of the request's ``n``
        it is. BadRequest when it can never run here (naming ``p.prompt_field`` when the
        prompt alone is too long, else ``p.limit_param``) or its sampling fields do not
        fit ``max_tokens``; ValueError when ``rid`` is in flight already."""
        try:
            self.core.validate(len(ids), max_tokens, pooling=max_tokens == 0)
        except ValueError as exc:  # more than the context or the KV cache holds
            # the prompt and one token of answer fit (max_request_tokens): the answer's
            # limit asks too much, else the prompt alone is too long
            field = p.limit_param if len(ids) < self.max_request_tokens else p.prompt_field
            raise BadRequest(str(exc), param=field) from exc
        try:
            params = SamplingParams(max_tokens=max(1, max_tokens), temperature=p.temperature,
                                    seed=p.seed, ignore_eos=p.ignore_eos,
                                    stop_token_ids=p.stop_token_ids, pooling=max_tokens == 0,
                                    sequence=sequence if p.temperature > 0 else 0,
                                    **p.sampling)
        except ValueError as exc:
            # SamplingParams names its field first ("min_tokens must be ...")
            name = str(exc).split(" ", 1)[0]
            raise BadRequest(str(exc), param=name if name in p.sampling else None) from exc
        req = await asyncio.to_thread(self.core.make_request, rid, ids, params,
                                      cache_salt=p.cache_salt)
        try:
            queue = self.engine.add(req)
        except EngineDeadError as exc:
            raise ServiceUnavailable(str(exc)) from exc
        self.metrics.started(rid)
        return queue

    async def _generate(self, request: HTTPRequest, *, chat: bool) -> Response:
        def parse(body: Any) -> tuple[GenerateParams, str | None]:
            # its request_id kept, not the body: its fields not served (``user``, any
            # other) would live for as long as the request runs
            p = parse_generate(body, chat=chat, model_name=self.model_name,
                               vocab_size=self.vocab_size)
            return p, optional(body, "request_id", str, None)

        p, body_id = await self.read_json(request, parse)
        prompts = each_prompt(p)
        id_lists = [truncate_prompt(ids, p.truncate_prompt_tokens, self.max_model_len)
                    for ids in await self.each_prompt_ids(prompts)]
        limit = self.max_model_len
        # unasked, an answer may run to the end of what a request may hold here
        limits = [p.max_tokens if p.max_tokens is not None
                  else max(1, self.max_request_tokens - len(ids)) for ids in id_lists]
        batch = len(id_lists) > 1
        for j, (ids, max_tokens) in enumerate(zip(id_lists, limits, strict=True)):
            if len(ids) + max_tokens > limit:  # every prompt checked before any runs
                raise context_error(len(ids), max_tokens, limit, chat, p.limit_param,
                                    j if batch else None)
        prefix = "chatcmpl-" if chat else "cmpl-"
        rid = prefix + uuid.uuid4().hex  # the engine's: unique while in flight
        # the answer's, as vLLM names it: the client's X-Request-Id, else the body's
        # request_id (vLLM's field), else the engine's
        given = request.headers.get("x-request-id") or body_id
        answer_id = prefix + given if given else rid
        gens: list[OpenAIGeneration] = []
        try:
            for j, (q, ids, max_tokens) in enumerate(zip(prompts, id_lists, limits,
                                                         strict=True)):
                for i in range(p.n):  # n sequences: the prefix cache shares the prompt
                    index = j * p.n + i  # as vLLM: prompt j's sequence i
                    child = child_params(q, i)
                    crid = rid if len(prompts) * p.n == 1 else f"{rid}-{index}"
                    queue = await self.submit(crid, ids, child, max_tokens, i)
                    gens.append(OpenAIGeneration(self, crid, index, chat, child, len(ids),
                                                 queue, sequence=i, prompt_ids=ids))
        except BaseException:
            abort_unended(gens)
            raise
        answer = OpenAIAnswer(answer_id, chat, p, gens)
        if p.stream:
            return AnswerStream(answer.sse(), gens)
        try:
            return await unless_disconnected(request, answer.response())
        except ClientDisconnected:
            abort_unended(gens)
            raise


class ServedBy:
    """ASGI wrapper that names the replica in every response's ``x-kvgate-served-by``
    header (``kvgate engine --served-by``), so a client behind any router can tell which
    replica answered."""

    HEADER = b"x-kvgate-served-by"

    def __init__(self, app: Any, name: str) -> None:
        if not name or not all(0x21 <= ord(c) <= 0x7E for c in name):
            raise ValueError(f"served-by name must be visible ASCII without spaces, got "
                             f"{name!r}")
        self.app = app
        self.header = (self.HEADER, name.encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


def build_app(server: EngineServer, *, api_key: str | None = None,
              responses_store: StoreSettings | None = None) -> Starlette:
    """The engine's app serving ``server``; with ``api_key``, every route but
    ``engine.api_key.OPEN_PATHS`` needs ``Authorization: Bearer <api_key>``;
    ``responses_store``: what ``/v1/responses`` stores (default: ``StoreSettings()``)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if server.kv_events is not None:
            server.kv_events.start()
        await server.engine.start()
        try:
            yield
        finally:
            await server.engine.stop()
            if server.kv_events is not None:  # joins its threads: off the event loop
                await asyncio.to_thread(server.kv_events.stop)

    embeddings = EmbeddingsRoute(server, max_body_bytes=MAX_BODY_BYTES)
    responses = ResponsesRoute(server, max_body_bytes=MAX_BODY_BYTES, store=responses_store)
    native = NativeGenerateRoute(server, max_body_bytes=MAX_BODY_BYTES)
    control = NativeControlRoutes(server)
    invocations = InvocationsRoute(server, embeddings.handle)
    routes = [
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings.handle, methods=["POST"]),
        Route("/invocations", invocations.handle, methods=["POST"]),  # SageMaker's, as vLLM's
        Route("/v1/responses", responses.handle, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"]),
        Route("/v1/responses/{response_id}/input_items", responses.input_items,
              methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", responses.cancel, methods=["POST"]),
        Route("/generate", native.handle, methods=["POST"]),
        Route("/abort_request", control.abort_request, methods=["POST"]),
        Route("/get_model_info", control.get_model_info, methods=["GET"]),
        Route("/v1/loads", control.loads, methods=["GET"]),
        Route("/get_load", control.get_load, methods=["GET"]),
        Route("/flush_cache", control.flush_cache, methods=["GET", "POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/health", server.health, methods=["GET"]),
        Route("/ping", server.health, methods=["GET", "POST"]),  # SageMaker's, as vLLM's
        Route("/version", server.version, methods=["GET"]),
        Route("/metrics", server.metrics_route, methods=["GET"]),
        Route("/tokenize", server.tokenize, methods=["POST"]),
        Route("/detokenize", server.detokenize, methods=["POST"]),
        Route("/reset_prefix_cache", server.reset_prefix_cache, methods=["POST"]),
    ]
    boundary = ErrorBoundary()

    async def engine_gone(request: HTTPRequest, exc: Exception) -> Response:
        # the engine loop stopped (or is stopping): a 503 naming why, not an internal error
        return boundary.response(request, ServiceUnavailable(str(exc)))

    # the key is looked at before any route (an unknown path is refused 401, not 404)
    gate = [Middleware(ApiKeyGate, key=api_key)] if api_key is not None else []
    app = Starlette(routes=routes, lifespan=lifespan, middleware=gate,
                    exception_handlers={**boundary.handlers(), EngineDeadError: engine_gone})
    app.router.redirect_slashes = False  # a path with a trailing / is a 404, not a redirect
    app.state.server = server
    return app
