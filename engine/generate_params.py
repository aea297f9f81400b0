"""A completions or chat body as the engine serves it: the shared OpenAI fields
(``kvwire.openai_schema``) plus the sampling fields only the engine reads, and the
``usage`` object of its answers. The sampling fields' readers serve SGLang's native
``/generate`` too (``engine.native_schema``); every route's body is decoded and checked
on the event loop or in a worker thread as ``kvwire.request_edge.parses_on_loop`` tells."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from engine.openai_logprobs import logprobs_asked, prompt_logprobs_asked
from kvwire.media_parts import shown
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
    # a stop string or stop token id kept in the text (the end-of-sequence token's too)
    include_stop: bool = False
    limit_param: str = "max_tokens"  # the field max_tokens came from
    prompt_field: str = "prompt"  # the field the prompt came from (a chat's: messages)
    skip_special_tokens: bool = True  # special tokens' text left out of the answer
    n: int = 1  # sequences of each prompt, one engine request each
    # a completions batch: every prompt (a text or token ids), the first one too, which
    # ``prompt_text``/``prompt_ids`` also hold; empty for one prompt (see ``each_prompt``)
    batch: tuple[str | list[int], ...] = ()
    # a chat's rendering: the assistant header after the messages, or the final
    # (assistant) message left open for the model to continue
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # a chat's ``chat_template_kwargs``, checked (``kvwire.template_kwargs``)
    chat_template_kwargs: dict[str, Any] | None = None
    # the prompt tokens kept, the last ones (``truncate_prompt_tokens``; -1: as many as the
    # model's context holds; None: all)
    truncate_prompt_tokens: int | None = None
    # log probabilities name tokens ``token_id:<id>`` instead of by their text
    return_tokens_as_token_ids: bool = False
    # the answer carries the prompt's token ids and each choice's output ids (vLLM's
    # ``return_token_ids``)
    return_token_ids: bool = False
    # with ``include_usage``: every streamed chunk carries the usage so far
    # (``stream_options.continuous_usage_stats``)
    continuous_usage: bool = False
    # SamplingParams' other fields; ``logprobs``: the alternatives asked per output token,
    # ``prompt_logprobs`` per prompt token
    sampling: dict[str, Any] = field(default_factory=dict)
    # the answer starts with the prompt (a completion's) or the last message's content (a
    # chat's, where that message has the answer's role); ``echo_only``: a completion's
    # ``max_tokens: 0`` with echo, answered with the prompt alone (as vLLM, one token is
    # generated and left out of the text, but counted in the usage)
    echo: bool = False
    echo_only: bool = False
    # a prompt of SGLang's native ``/generate``: refused in SGLang's words when too long
    native: bool = False


# what the engine does not do, refused rather than ignored: (field, the values that ask
# for nothing, chats only)
_UNSUPPORTED: tuple[tuple[str, tuple[Any, ...], bool], ...] = (
    ("best_of", (None, 1), False), ("suffix", (None, ""), False),
    ("guided_json", (None,), False), ("guided_regex", (None,), False),
    ("guided_choice", (None,), False), ("guided_grammar", (None,), False),
    ("structured_outputs", (None,), False),
    # vLLM's sampling fields that restrict or search the output
    ("use_beam_search", (None, False), False), ("allowed_token_ids", (None,), False),
    ("bad_words", (None, []), False), ("logprob_token_ids", (None,), False),
    # vLLM refuses a priority unless it schedules by priority; this engine does not
    ("priority", (None, 0), False),
    # truncate_prompt_tokens keeps a prompt's last tokens (vLLM's "left"), never its first
    ("truncation_side", (None, "left"), False),
    # a chat template or logits processors given with the request: vLLM refuses them
    # unless started to trust them (--trust-request-chat-template,
    # --logits-processor-pattern); this engine renders with the model's template alone
    ("chat_template", (None,), True), ("logits_processors", (None, []), False))
_INT64 = (-(1 << 63), (1 << 63) - 1)
# the most sequences one request may ask for: ``n`` of each of its prompts, each an
# engine request
MAX_N = 64
# the most stop strings one request may give, and their characters in all: vLLM sets no
# bound and OpenAI allows 4; every output token of every sequence is searched for each
# string (from its own length before the new text), so these keep that search to a few
# microseconds a token, far above what eval harnesses and chat templates send (a handful
# of strings, tens of characters each)
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096
# stop token ids, each looked for in every sampled token (a list of a million held every
# step for as many comparisons per sequence)
MAX_STOP_TOKEN_IDS = 1024


def _refuse_unsupported(body: Any, chat: bool) -> None:
    for name, nothing, chats in _UNSUPPORTED:
        if chats and not chat:
            continue
        value = body.get(name) if isinstance(body, dict) else None
        if not any(value is v or (type(value) is type(v) and value == v) for v in nothing):
            raise BadRequest(f"{name!r} is not supported by this engine (got {shown(value)})",
                             param=name)


def check_special_tokens(body: dict[str, Any], chat: bool) -> None:
    """vLLM's ``add_special_tokens``: a completion's prompt is encoded inside the tokenizer's
    special tokens and a chat's rendering is not (its template writes its own), as vLLM's
    defaults (true, false) do; the other value is refused rather than ignored (the
    gateway routes on the ids those defaults give)."""
    asked = optional(body, "add_special_tokens", bool, not chat)
    if asked is chat:
        raise BadRequest(f"'add_special_tokens' {str(asked).lower()} is not supported by "
                         f"this engine: a {'chat' if chat else 'completion'}'s prompt is "
                         f"encoded {'without' if chat else 'with'} the tokenizer's special "
                         "tokens", param="add_special_tokens")


def parse_generate(body: Any, *, chat: bool, model_name: str, vocab_size: int) -> GenerateParams:
    echo = bool(optional(body, "echo", bool, False)) if isinstance(body, dict) else False
    echo_only = echo and not chat and optional(body, "max_tokens", int, None) == 0
    if echo_only:  # as vLLM: the prompt is computed with one token, which is left out
        body = {**body, "max_tokens": 1}
    fields = parse_fields(body, chat=chat)
    check_served(fields.model, model_name)
    n = optional(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise BadRequest(f"'n' must be in [1, {MAX_N}], got {n}", param="n")
    if fields.num_prompts * n > MAX_N:
        raise BadRequest(f"'prompt' holds {fields.num_prompts} prompts, which with n={n} "
                         f"makes {fields.num_prompts * n} sequences, more than {MAX_N}",
                         param="prompt")
    _refuse_unsupported(body, chat)
    check_special_tokens(body, chat)
    batch = _batch(body, fields.num_prompts)
    for ids in [fields.prompt_ids, *batch]:
        bad = next((t for t in ids if t >= vocab_size), None) \
            if isinstance(ids, list) else None
        if bad is not None:
            raise BadRequest(f"token id {bad} in 'prompt' is outside the vocabulary "
                             f"[0, {vocab_size})", param="prompt")
    max_tokens = fields.max_tokens
    if max_tokens is None and not chat and "max_tokens" not in body:
        max_tokens = 16  # as vLLM: a completion's default; null runs to the context's end
    options = optional(body, "stream_options", dict, {})
    if options and not fields.stream:
        raise BadRequest("'stream_options' can only be set when 'stream' is true",
                         param="stream_options")
    include_usage = bool(optional(options, "include_usage", bool, False))  # "false" too
    continuous = bool(optional(options, "continuous_usage_stats", bool, False))
    _check_response_format(body)
    if chat:
        _check_tool_choice(body, fields.tools)
        # checked, not acted on: the engine parses no tool calls out of its answers
        optional(body, "parallel_tool_calls", bool, True)
    generation_prompt, continue_final = _turn_fields(body, fields.messages) if chat \
        else (True, False)
    truncate = optional(body, "truncate_prompt_tokens", int, None)
    if truncate is not None and truncate != -1 and truncate < 1:
        raise BadRequest(f"'truncate_prompt_tokens' must be an integer >= 1 or -1, got "
                         f"{truncate}", param="truncate_prompt_tokens")
    stop, stop_ids = stop_fields(body, vocab_size)
    sampling = sampling_fields(body, vocab_size)
    logprobs = logprobs_asked(body, chat)
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    prompt_logprobs = prompt_logprobs_asked(body, fields.stream, vocab_size)
    if prompt_logprobs is None and echo and not chat:
        prompt_logprobs = logprobs  # as vLLM: an echoed prompt's tokens get theirs too
    if prompt_logprobs is not None:
        sampling["prompt_logprobs"] = prompt_logprobs
    return GenerateParams(
        chat=chat,
        n=n,
        prompt_text=fields.prompt_text,
        prompt_ids=fields.prompt_ids,
        batch=batch,
        messages=fields.messages,
        chat_template_kwargs=fields.chat_template_kwargs,
        tools=fields.tools,
        max_tokens=max_tokens,
        temperature=temperature_field(body),
        seed=seed_field(body, "seed"),
        stream=fields.stream,
        include_usage=include_usage,
        ignore_eos=bool(optional(body, "ignore_eos", bool, False)),
        cache_salt=fields.cache_salt,
        stop=stop,
        stop_token_ids=stop_ids,
        include_stop=bool(optional(body, "include_stop_str_in_output", bool, False)),
        skip_special_tokens=_skip_special_tokens(body),
        limit_param="max_completion_tokens" if chat and body.get("max_completion_tokens")
        is not None else "max_tokens",
        prompt_field="messages" if chat else "prompt",
        sampling=sampling,
        add_generation_prompt=generation_prompt,
        continue_final_message=continue_final,
        truncate_prompt_tokens=truncate,
        return_tokens_as_token_ids=bool(optional(body, "return_tokens_as_token_ids", bool,
                                                 False)),
        return_token_ids=bool(optional(body, "return_token_ids", bool, False)),
        continuous_usage=include_usage and continuous,
        echo=echo,
        echo_only=echo_only,
    )


def _skip_special_tokens(body: dict[str, Any]) -> bool:
    """vLLM's ``skip_special_tokens`` (true unless given); ``spaces_between_special_tokens``
    is checked and unused: a fast tokenizer (vLLM's and this engine's) ignores it."""
    optional(body, "spaces_between_special_tokens", bool, True)
    return bool(optional(body, "skip_special_tokens", bool, True))


def _batch(body: dict[str, Any], num_prompts: int) -> tuple[str | list[int], ...]:
    """Every prompt of a completions batch (``prompt`` a list of texts or of token id lists,
    as ``parse_fields`` checked it); () for one prompt."""
    if num_prompts == 1:
        return ()
    return tuple(p if isinstance(p, str) else list(p) for p in body["prompt"])


def each_prompt(p: GenerateParams) -> list[GenerateParams]:
    """A request's prompts, each with its own parameters, in order: a batch's one per
    prompt (``n`` sequences of each), else the request's own."""
    return [dataclasses.replace(p, prompt_text=x if isinstance(x, str) else None,
                                prompt_ids=None if isinstance(x, str) else x, batch=())
            for x in p.batch] or [p]


# The fields below are read the same way from an OpenAI body and from the
# ``sampling_params`` of SGLang's native ``/generate`` (``engine.native_generate``).


def temperature_field(body: dict[str, Any]) -> float:
    temperature = float(optional(body, "temperature", (int, float), 1.0))
    if not temperature >= 0 or temperature == float("inf"):
        raise BadRequest(f"temperature must be >= 0, got {temperature}", param="temperature")
    return temperature


def seed_field(body: dict[str, Any], key: str) -> int | None:
    seed = optional(body, key, int, None)
    if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
        raise BadRequest(f"'{key}' must be a 64-bit signed integer, got {seed}", param=key)
    return seed


def stop_fields(body: dict[str, Any], vocab_size: int
                ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(stop strings, stop token ids) of ``stop`` (a string or a list of them) and
    ``stop_token_ids`` (each a token id of the vocabulary, ``[0, vocab_size)``)."""
    stop = optional(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP_STRINGS:
        raise BadRequest(f"'stop' holds {len(stop)} strings, more than {MAX_STOP_STRINGS}",
                         param="stop")
    if not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings", param="stop")
    chars = sum(len(s) for s in stop)
    if chars > MAX_STOP_CHARS:
        raise BadRequest(f"'stop' holds {chars} characters, more than {MAX_STOP_CHARS}",
                         param="stop")
    stop_ids = optional(body, "stop_token_ids", list, [])
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise BadRequest(f"'stop_token_ids' holds {len(stop_ids)} ids, more than "
                         f"{MAX_STOP_TOKEN_IDS}", param="stop_token_ids")
    for t in stop_ids:
        # an integer past 64 bits is read (by orjson) as a float: an id, out of range
        huge = isinstance(t, float) and t.is_integer() and abs(t) >= 1 << 63
        if not huge and (not isinstance(t, int) or isinstance(t, bool)):
            raise BadRequest(f"'stop_token_ids' must be a list of integers, got "
                             f"{shown(t, 80)} in it", param="stop_token_ids")
        if huge or not 0 <= t < vocab_size:
            named = f"about {t:.6g}" if huge else str(t)
            raise BadRequest(f"token id {named} in 'stop_token_ids' is outside the "
                             f"vocabulary [0, {vocab_size})", param="stop_token_ids")
    return tuple(stop), tuple(stop_ids)


# sampling fields as vLLM names them, their types, defaults and the range each must be in
_SAMPLING = (
    ("top_k", int, 0, lambda v: v >= -1, "-1, 0 (every token) or >= 1"),
    ("top_p", (int, float), 1.0, lambda v: 0 < v <= 1, "in (0, 1]"),
    ("min_p", (int, float), 0.0, lambda v: 0 <= v <= 1, "in [0, 1]"),
    ("presence_penalty", (int, float), 0.0, lambda v: -2 <= v <= 2, "in [-2, 2]"),
    ("frequency_penalty", (int, float), 0.0, lambda v: -2 <= v <= 2, "in [-2, 2]"),
    ("repetition_penalty", (int, float), 1.0, lambda v: 0 < v < float("inf"), "> 0"),
    ("min_tokens", int, 0, lambda v: v >= 0, ">= 0"),
)


def sampling_fields(body: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The sampling fields beyond temperature and seed, checked, as ``SamplingParams``'
    keyword arguments (those at their defaults left out)."""
    out: dict[str, Any] = {}
    for name, types, default, ok, bounds in _SAMPLING:
        value = optional(body, name, types, default)
        if not ok(value):
            raise BadRequest(f"'{name}' must be {bounds}, got {shown(value)}", param=name)
        if value != default:
            out[name] = value
    bias = optional(body, "logit_bias", dict, {})
    pairs = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise BadRequest(f"'logit_bias' keys must be token ids, got {shown(key)}",
                             param="logit_bias") from None
        if not 0 <= token < vocab_size:
            raise BadRequest(f"'logit_bias' token id {token} is outside the vocabulary "
                             f"[0, {vocab_size})", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not -100 <= value <= 100:
            raise BadRequest(f"'logit_bias' values must be numbers in [-100, 100], got "
                             f"{shown(value)} for token {token}", param="logit_bias")
        pairs.append((token, float(value)))
    if pairs:
        out["logit_bias"] = tuple(pairs)
    return out


def _turn_fields(body: dict[str, Any], messages: list[Any] | None) -> tuple[bool, bool]:
    """A chat's ``add_generation_prompt`` (true unless given) and ``continue_final_message``
    (false unless given), as vLLM reads them: not both true, and a message to continue
    must be the assistant's."""
    generation_prompt = bool(optional(body, "add_generation_prompt", bool, True))
    continue_final = bool(optional(body, "continue_final_message", bool, False))
    if generation_prompt and continue_final:
        raise BadRequest("'continue_final_message' and 'add_generation_prompt' cannot both "
                         "be true", param="continue_final_message")
    role = messages[-1].get("role") if continue_final and messages else "assistant"
    if role != "assistant":
        raise BadRequest(f"'continue_final_message' needs the last message to be the "
                         f"assistant's, got role {shown(role)}", param="continue_final_message")
    return generation_prompt, continue_final


def _check_response_format(body: dict[str, Any]) -> None:
    """A ``response_format`` asking for constrained output (a completion's too, as vLLM
    reads it on both routes), refused."""
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise BadRequest(f"'response_format' must be an object, got {shown(fmt)}",
                             param="response_format")
        kind = fmt.get("type")
        if kind not in ("text", "json_object", "json_schema", "structural_tag"):
            raise BadRequest(f"'response_format.type' must be 'text', 'json_object', "
                             f"'json_schema' or 'structural_tag', got {shown(kind)}",
                             param="response_format")
        if kind != "text":
            raise BadRequest(f"'response_format' of type {shown(kind)} (constrained output) is "
                             "not supported by this engine", param="response_format")


def _check_tool_choice(body: dict[str, Any], tools: list[Any] | None) -> None:
    """A chat's ``tool_choice`` that forces a tool call (constrained output), refused."""
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto"):
        return
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") \
            if isinstance(choice.get("function"), dict) else None
        known = {t.get("function", {}).get("name") for t in tools or ()
                 if isinstance(t, dict) and isinstance(t.get("function"), dict)}
        if name not in known:
            raise BadRequest(f"tool {shown(name)} in 'tool_choice' has not been passed in "
                             "'tools'", param="tool_choice")
    elif choice != "required":
        raise BadRequest(f"'tool_choice' must be 'none', 'auto', 'required' or a named "
                         f"function, got {shown(choice)}", param="tool_choice")
    raise BadRequest("'tool_choice' that forces a tool call (constrained output) is not "
                     "supported by this engine", param="tool_choice")


class TooManyTokens(Exception):
    """Text ``index`` of those given to encode was proven to encode to more tokens than a
    route takes (``at_least`` of them at least), before it was encoded whole. ``in_all``:
    texts 0..``index`` together hold at least ``at_least`` tokens, more than the route
    takes in all (proven as they were encoded, those before ``index`` whole)."""

    def __init__(self, index: int, at_least: int, in_all: bool = False) -> None:
        what = f"texts 0..{index} encode" if in_all else f"text {index} encodes"
        super().__init__(f"{what} to at least {at_least} tokens")
        self.index = index
        self.at_least = at_least
        self.in_all = in_all


def truncation_keep(keep: int | None, max_model_len: int) -> int | None:
    """The prompt tokens ``truncate_prompt_tokens`` keeps: -1 ``max_model_len``, None all;
    more than the model's context is a BadRequest."""
    if keep == -1:
        keep = max_model_len
    if keep is not None and keep > max_model_len:
        raise BadRequest(f"'truncate_prompt_tokens' ({keep}) is greater than the model's "
                         f"maximum context length ({max_model_len})",
                         param="truncate_prompt_tokens")
    return keep


def truncate_prompt(ids: list[int], keep: int | None, max_model_len: int) -> list[int]:
    """The last ``keep`` of a prompt's ``ids``, as vLLM truncates a prompt on the left
    (``truncate_prompt_tokens``, read by ``truncation_keep``)."""
    keep = truncation_keep(keep, max_model_len)
    return ids if keep is None else ids[-keep:]


def context_error(num_prompt: int, max_tokens: int, max_model_len: int,
                  chat: bool = True, limit_param: str = "max_tokens",
                  batch_index: int | None = None,
                  prompt_field: str | None = None, at_least: bool = False) -> BadRequest:
    """The context-length error (vLLM's words), naming the chat's ``messages`` or the
    completion's ``prompt`` (or ``prompt_field``: a Responses request's ``input``) when the
    prompt alone is too long, else the output limit's field; ``batch_index``: which prompt
    of a completions batch it is; ``at_least``: ``num_prompt`` is a count the prompt
    reaches, not its length (a prompt refused before it was encoded whole)."""
    what = prompt_field or ("messages" if chat else "prompt")
    which = "" if batch_index is None else f" (prompt {batch_index} of the batch)"
    least = "at least " if at_least else ""
    return BadRequest(
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {least}{num_prompt + max_tokens} tokens ({least}{num_prompt} in the "
        f"{what}, {max_tokens} in the completion). Please reduce the length of the {what} or "
        f"completion.{which}",
        param=limit_param if num_prompt < max_model_len else what,
    )


def usage(num_prompt: int, num_output: int, num_cached: int, details: bool = True
          ) -> dict[str, Any]:
    """An answer's ``usage``; ``details``: with ``prompt_tokens_details`` (the cached
    tokens), which vLLM adds only with ``--enable-prompt-tokens-details``."""
    out: dict[str, Any] = {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
    }
    if details:
        out["prompt_tokens_details"] = {"cached_tokens": max(0, num_cached)}
    return out
