"""A completions or chat body as the engine serves it: the shared OpenAI fields
(``kvwire.openai_schema``) plus the sampling fields only the engine reads, and the
``usage`` object of its answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvwire.openai_schema import BadRequest, check_served, optional, parse_fields


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """A validated completions or chat request, before tokenization."""

    chat: bool
    prompt_text: str | None
    prompt_ids: list[int] | None
    messages: list[Any] | None
    tools: list[Any] | None
    max_tokens: int | None
    temperature: float
    seed: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool
    cache_salt: str | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]


# what the engine does not do, refused rather than ignored: (field, the values that ask
# for nothing, chats only)
_UNSUPPORTED = (("logprobs", (None, False, 0), False), ("top_logprobs", (None, 0), True),
                ("echo", (None, False), False), ("best_of", (None, 1), False),
                ("suffix", (None, ""), False))


def _refuse_unsupported(body: Any, chat: bool) -> None:
    for field, nothing, chats in _UNSUPPORTED:
        if chats and not chat:
            continue
        value = body.get(field) if isinstance(body, dict) else None
        if not any(value is v or (type(value) is type(v) and value == v) for v in nothing):
            raise BadRequest(f"{field!r} is not supported by this engine (got {value!r:.40})",
                             param=field)


def parse_generate(body: Any, *, chat: bool, model_name: str, vocab_size: int) -> GenerateParams:
    fields = parse_fields(body, chat=chat)
    check_served(fields.model, model_name)
    if optional(body, "n", int, 1) != 1:
        raise BadRequest("only n=1 is supported", param="n")
    if fields.num_prompts != 1:
        raise BadRequest("'prompt' must be one prompt per request", param="prompt")
    _refuse_unsupported(body, chat)
    ids = fields.prompt_ids
    bad = next((t for t in ids if t >= vocab_size), None) if ids is not None else None
    if bad is not None:
        raise BadRequest(f"token id {bad} in 'prompt' is outside the vocabulary "
                         f"[0, {vocab_size})", param="prompt")
    max_tokens = fields.max_tokens
    if max_tokens is None and not chat:
        max_tokens = 16
    temperature = float(optional(body, "temperature", (int, float), 1.0))
    if temperature < 0:
        raise BadRequest(f"temperature must be >= 0, got {temperature}", param="temperature")
    options = optional(body, "stream_options", dict, {})
    stop = optional(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings", param="stop")
    stop_ids = optional(body, "stop_token_ids", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise BadRequest("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    return GenerateParams(
        chat=chat,
        prompt_text=fields.prompt_text,
        prompt_ids=ids,
        messages=fields.messages,
        tools=fields.tools,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=optional(body, "seed", int, None),
        stream=fields.stream,
        include_usage=bool(options.get("include_usage", False)),
        ignore_eos=bool(optional(body, "ignore_eos", bool, False)),
        cache_salt=fields.cache_salt,
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
    )


def context_error(num_prompt: int, max_tokens: int, max_model_len: int,
                  chat: bool = True) -> BadRequest:
    """The context-length error, naming the chat's ``messages`` or the completion's
    ``prompt`` when the prompt alone is too long."""
    what = "messages" if chat else "prompt"
    return BadRequest(
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the {what}, "
        f"{max_tokens} in the completion). Please reduce the length of the {what} or "
        f"completion.",
        param="max_tokens" if num_prompt < max_model_len else what,
    )


def usage(num_prompt: int, num_output: int, num_cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
        "prompt_tokens_details": {"cached_tokens": max(0, num_cached)},
    }
