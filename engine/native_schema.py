"""The wire shapes of SGLang's native ``POST /generate``: the request read into the
engine's own :class:`GenerateParams`, one per prompt, and each answer's ``finish_reason``.

Shapes follow SGLang's runtime (``GenerateReqInput``, ``SamplingParams``)::

    request:  {"text": str | [str]  or  "input_ids": [int] | [[int]],
               "sampling_params"?: {...} | [{...}, one per prompt],
               "rid"?: str | [str], "stream"?: bool, "model"?: str, "cache_salt"?: str,
               "return_logprob"?: bool, "top_logprobs_num"?: int,
               "logprob_start_len"?: -1, "return_text_in_logprobs"?: bool,
               "return_prompt_token_ids"?: bool, ...}
    answer:   {"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
               "weight_version", "completion_tokens", "cached_tokens",
               "e2e_latency" (once finished), log probabilities (when asked)}}

A list in ``text`` or ``input_ids`` is a batch, answered with a list of answers in order;
its ``rid`` is a list of ids, or one string each prompt's id is made from (``rid_0``,
``rid_1`` ...); ``return_logprob``, ``logprob_start_len`` and ``top_logprobs_num`` may
give one value per prompt. ``finish_reason`` is ``{"type": "length", "length":
max_new_tokens}``, ``{"type": "stop", "matched": <token id or stop string>}`` or
``{"type": "abort", "message", "status_code", "err_type"}``. ``max_new_tokens``
defaults to 128, cut to what fits; 0 computes the prompt alone.

Log probabilities are of output tokens only: a ``logprob_start_len`` that asks for
prompt positions is refused. Fields this engine cannot honour (prompt log
probabilities, ``token_ids_logprob``, constrained output, multimodal inputs, LoRA,
sessions, hidden states, entropy ...) are refused naming the field, unless they ask for
nothing; top-level fields SGLang's routers add (``routed_dp_rank``, ``log_metrics`` ...)
are ignored, as SGLang ignores fields it does not know; a sampling parameter it does not
know is refused. ``custom_params`` is accepted and unused, as SGLang does without a
``custom_logit_processor`` (which is refused).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from engine.generate_params import (
    GenerateParams,
    sampling_fields,
    seed_field,
    stop_fields,
    temperature_field,
)
from engine.native_logprobs import LogprobAsk, logprob_asks
from kvwire.media_parts import shown
from kvwire.openai_schema import (
    BadRequest,
    check_cache_salt,
    check_served,
    is_token_ids,
    model_field,
    optional,
)

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's, when the request names none
MAX_BATCH = 2048  # prompts in one request (the embeddings route's limit too)

# top-level fields of SGLang's GenerateReqInput asking for what the engine does not do,
# and the values that ask for nothing (a batch may give one value per prompt)
_OFF, _NONE = (None, False), (None,)
_UNSUPPORTED = (
    ("input_embeds", _NONE), ("image_data", _NONE), ("video_data", _NONE),
    ("audio_data", _NONE), ("mm_hashes", _NONE), ("mm_content_hashes", _NONE),
    ("use_audio_in_video", _OFF), ("video_config", _NONE), ("images_config", _NONE),
    ("max_dynamic_patch", _NONE), ("min_dynamic_patch", _NONE),
    ("image_max_dynamic_patch", _NONE), ("video_max_dynamic_patch", _NONE),
    ("positional_embed_overrides", _NONE), ("multi_item_delimiter_indices", _NONE),
    ("token_ids_logprob", _NONE), ("return_sampling_mask", _OFF),
    ("return_flat_raw_top_logprobs", _OFF), ("return_flat_raw_top_logprobs_b64", _OFF),
    ("return_hidden_states", _OFF), ("return_routed_experts", _OFF),
    ("return_indexer_topk", _OFF), ("return_entropy", _OFF), ("return_bytes", _OFF),
    ("lora_path", _NONE), ("lora_id", _NONE), ("custom_logit_processor", _NONE),
    ("session_params", _NONE), ("extra_key", (None, "")), ("bootstrap_host", _NONE),
    ("bootstrap_port", _NONE), ("bootstrap_room", _NONE), ("bootstrap_pair_key", _NONE),
    ("max_thinking_tokens", _NONE), ("require_reasoning", _OFF), ("background", _OFF))
# sampling parameters that constrain the output, refused unless null
_CONSTRAINED = ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex")
_SAMPLING_KNOWN = frozenset({
    "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias", "stop",
    "stop_token_ids", "ignore_eos", "no_stop_trim", "sampling_seed", "n",
    "skip_special_tokens", "spaces_between_special_tokens", "stream_interval",
    "custom_params", *_CONSTRAINED})
# read by ``sampling_fields`` under the same names as vLLM's
_SHARED = ("top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty",
           "repetition_penalty", "logit_bias")


@dataclass(frozen=True, slots=True)
class NativeItem:
    """One prompt of a ``/generate`` body: its request id, its fields as the engine's
    (``params.max_tokens`` None: SGLang's default), where its sampling parameters sit
    (``sampling_params.`` or ``sampling_params[i].``, naming a field in an error), the
    output tokens each streamed event waits for (``stream_interval``), and the log
    probabilities it asks for (None: none)."""

    rid: str
    params: GenerateParams
    where: str
    stream_interval: int
    logprobs: LogprobAsk | None = None

    @property
    def prompt_field(self) -> str:
        return self.params.prompt_field


@dataclass(frozen=True, slots=True)
class NativeRequest:
    items: tuple[NativeItem, ...]
    batch: bool  # answered with a list
    stream: bool
    prompt_ids_back: bool = False  # return_prompt_token_ids: answers carry the prompt's ids


def parse_native(body: Any, *, model_name: str, vocab_size: int) -> NativeRequest:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    check_served(model_field(body), model_name)
    for name, nothing in _UNSUPPORTED:
        value = body.get(name)
        values = value if isinstance(value, list) else [value]
        if not all(any(v is n or (type(v) is type(n) and v == n) for n in nothing)
                   for v in values):
            raise BadRequest(f"{name!r} is not supported by this engine (got {shown(value)})",
                             param=name)
    texts, ids, batch = _prompts(body, vocab_size)
    n = len(texts if texts is not None else ids or ())
    stream = bool(optional(body, "stream", bool, False))
    if stream and batch:
        raise BadRequest("a batch (a list in 'text' or 'input_ids') is answered whole; "
                         "stream its prompts one request each", param="stream")
    rids = _rids(body.get("rid"), n, batch)
    salt = check_cache_salt(body.get("cache_salt"))
    asks = logprob_asks(body, n, batch, vocab_size)
    prompt_ids_back = bool(optional(body, "return_prompt_token_ids", bool, False))
    per_item = body.get("sampling_params")
    if isinstance(per_item, list) and batch:
        if len(per_item) != n:
            raise BadRequest(f"'sampling_params' has {len(per_item)} entries for {n} "
                             "prompts", param="sampling_params")
        found = [(f"sampling_params[{i}].", sp) for i, sp in enumerate(per_item)]
    else:
        found = [("sampling_params.", per_item)] * n
    items = []
    for i, ((where, sp), ask) in enumerate(zip(found, asks, strict=True)):
        if sp is not None and not isinstance(sp, dict):
            raise BadRequest("'sampling_params' must be an object (or, for a batch, a list "
                             f"of them), got {shown(sp)}", param=where.rstrip("."))
        with _under(where):
            params, interval = _item_params(
                sp or {}, vocab_size, text=texts[i] if texts is not None else None,
                ids=ids[i] if ids is not None else None, stream=stream, salt=salt,
                where=where, top=None if ask is None else ask.top)
        items.append(NativeItem(rids[i], params, where, interval, ask))
    return NativeRequest(tuple(items), batch, stream, prompt_ids_back)


def answer_limit(item: NativeItem, num_prompt: int, *, max_model_len: int,
                 max_request_tokens: int) -> int:
    """The tokens ``item`` may generate after a prompt of ``num_prompt`` tokens, as
    SGLang resolves it: a prompt that fills the context, or a ``max_new_tokens`` past
    it, refused (SGLang's wording); none asked, 128 cut to what a request may hold."""
    if num_prompt >= max_model_len:
        raise input_too_long(num_prompt, max_model_len, item.prompt_field)
    asked = item.params.max_tokens
    if asked is None:
        limit = max(1, min(DEFAULT_MAX_NEW_TOKENS, max_request_tokens - num_prompt))
    elif num_prompt + asked > max_model_len:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of "
            f"{max_model_len} tokens. You requested a total of {num_prompt + asked} tokens: "
            f"{num_prompt} tokens from the input and {asked} tokens for the completion. "
            "Please reduce the number of tokens in the input or the completion to fit "
            "within the limit.", param=item.where + "max_new_tokens")
    else:
        limit = asked
    least = item.params.sampling.get("min_tokens", 0)
    if least > limit:
        raise BadRequest(f"'min_new_tokens' must be in [0, max_new_tokens ({limit})], got "
                         f"{least}", param=item.where + "min_new_tokens")
    return limit


def input_too_long(num_prompt: int, max_model_len: int, field: str, at_least: bool = False
                   ) -> BadRequest:
    """SGLang's refusal of a prompt that fills the context; ``at_least``: ``num_prompt`` is
    a count the prompt reaches (refused before it was encoded whole)."""
    least = "at least " if at_least else ""
    return BadRequest(f"The input ({least}{num_prompt} tokens) is longer than the model's "
                      f"context length ({max_model_len} tokens).", param=field)


def finish_reason(reason: str, *, max_tokens: int, stop: str | None,
                  token_ids: list[int]) -> dict[str, Any]:
    """SGLang's ``finish_reason`` of an answer the engine ended with ``reason``: a stop
    string or the last token (the end of sequence or a stop token id) it matched."""
    if reason == "length" or max_tokens == 0:  # 0: a prefill alone ends as 'stop' here
        return {"type": "length", "length": max_tokens}
    if reason == "stop":
        return {"type": "stop", "matched": stop if stop is not None
                else token_ids[-1] if token_ids else None}
    return {"type": reason}


@contextlib.contextmanager
def _under(prefix: str) -> Iterator[None]:
    """A BadRequest raised inside names its field under ``prefix``."""
    try:
        yield
    except BadRequest as exc:
        if exc.param is not None:
            exc.param = prefix + exc.param
        raise


def _prompts(body: dict[str, Any], vocab_size: int
             ) -> tuple[list[str] | None, list[list[int]] | None, bool]:
    """(texts, or token id lists, whether a batch) of ``text`` or ``input_ids``."""
    text, ids = body.get("text"), body.get("input_ids")
    if text is None and ids is None:
        raise BadRequest("either 'text' or 'input_ids' is required", param="text")
    if text is not None and ids is not None:
        raise BadRequest("give 'text' or 'input_ids', not both", param="input_ids")
    if text is not None:
        if isinstance(text, str):
            texts, batch = [text], False
        elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            texts, batch = text, True
        else:
            raise BadRequest(f"'text' must be a string or a non-empty list of strings, got "
                             f"{shown(text)}", param="text")
        empty = next((i for i, t in enumerate(texts) if not t), None)
        if empty is not None:
            raise BadRequest("'text' must not be empty" if not batch else
                             f"'text' holds an empty string at index {empty}", param="text")
        _check_batch(len(texts), batch, "text")
        return texts, None, batch
    if isinstance(ids, list) and ids and is_token_ids(ids):
        lists, batch = [ids], False
    elif isinstance(ids, list) and ids and all(
            isinstance(one, list) and one and is_token_ids(one) for one in ids):
        lists, batch = ids, True
    else:
        raise BadRequest("'input_ids' must be a non-empty list of token ids (non-negative "
                         f"integers) or a non-empty list of them, got {shown(ids)}",
                         param="input_ids")
    _check_batch(len(lists), batch, "input_ids")
    bad = next((t for one in lists for t in one if t >= vocab_size), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} in 'input_ids' is outside the vocabulary "
                         f"[0, {vocab_size})", param="input_ids")
    return None, lists, batch


def _check_batch(n: int, batch: bool, field: str) -> None:
    if batch and n > MAX_BATCH:
        raise BadRequest(f"'{field}' holds {n} prompts; at most {MAX_BATCH} are allowed per "
                         "request", param=field)


def _rids(value: Any, n: int, batch: bool) -> list[str]:
    if value is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(value, str) and value:
        return [f"{value}_{i}" for i in range(n)] if batch else [value]
    if batch and isinstance(value, list) and len(value) == n \
            and all(isinstance(r, str) and r for r in value):
        seen: set[str] = set()
        for rid in value:
            if rid in seen:
                raise BadRequest(f"'rid' holds {shown(rid)} twice", param="rid")
            seen.add(rid)
        return list(value)
    shape = f"a non-empty string or a list of {n}, one per prompt" if batch \
        else "a non-empty string"
    raise BadRequest(f"'rid' must be {shape}, got {shown(value)}", param="rid")


def _item_params(sp: dict[str, Any], vocab_size: int, *, text: str | None,
                 ids: list[int] | None, stream: bool, salt: str | None, where: str,
                 top: int | None) -> tuple[GenerateParams, int]:
    """One prompt and its sampling parameters as the engine's fields (``top``: the
    alternatives each token's log probability comes with; None: no log probabilities),
    and its ``stream_interval``."""
    unknown = next((k for k in sp if k not in _SAMPLING_KNOWN), None)
    if unknown is not None:
        raise BadRequest(f"unknown sampling parameter {shown(unknown)}", param=unknown)
    for name in _CONSTRAINED:
        if sp.get(name) is not None:
            raise BadRequest(f"{name!r} (constrained output) is not supported by this "
                             f"engine (got {shown(sp[name])})", param=name)
    optional(sp, "custom_params", dict, None)  # read by a custom logit processor alone
    n = optional(sp, "n", int, 1)
    if n != 1:
        raise BadRequest(f"only n=1 is supported, got {n}", param="n")
    skip_special = bool(optional(sp, "skip_special_tokens", bool, True))
    # a slow tokenizer's option; fast tokenizers (SGLang's, and this engine's) ignore it
    optional(sp, "spaces_between_special_tokens", bool, True)
    max_new = optional(sp, "max_new_tokens", int, None)
    if max_new is not None and max_new < 0:
        raise BadRequest(f"'max_new_tokens' must be at least 0, got {max_new}",
                         param="max_new_tokens")
    least = optional(sp, "min_new_tokens", int, 0)
    if least < 0:
        raise BadRequest(f"'min_new_tokens' must be at least 0, got {least}",
                         param="min_new_tokens")
    interval = optional(sp, "stream_interval", int, 1)
    if interval < 1:
        raise BadRequest(f"'stream_interval' must be at least 1, got {interval}",
                         param="stream_interval")
    stop, stop_ids = stop_fields(sp, vocab_size)
    sampling = sampling_fields({**{k: sp[k] for k in _SHARED if k in sp},
                                "min_tokens": least}, vocab_size)
    if top is not None:
        sampling["logprobs"] = top
    params = GenerateParams(
        chat=False, prompt_text=text, prompt_ids=ids, messages=None, tools=None,
        max_tokens=max_new, temperature=temperature_field(sp),
        seed=seed_field(sp, "sampling_seed"), stream=stream, include_usage=False,
        ignore_eos=bool(optional(sp, "ignore_eos", bool, False)), cache_salt=salt,
        stop=stop, stop_token_ids=stop_ids,
        include_stop=bool(optional(sp, "no_stop_trim", bool, False)),
        limit_param=where + "max_new_tokens",
        prompt_field="text" if text is not None else "input_ids",
        skip_special_tokens=skip_special, sampling=sampling, native=True)
    return params, interval

