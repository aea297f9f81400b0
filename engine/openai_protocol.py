"""Parsing and validation of OpenAI-style request bodies, and the error type the server
maps to ``{"error": {"message", "type", "param", "code"}}`` bodies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.tokenizer import ChatFormatError, check_tools

MAX_CACHE_SALT_CHARS = 128


class APIError(Exception):
    """A client-visible error with its HTTP status."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None,
        err_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.err_type = err_type or _TYPES.get(status, "BadRequestError")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type,
                          "param": self.param, "code": self.status}}


_TYPES = {400: "BadRequestError", 404: "NotFoundError", 413: "RequestTooLargeError",
          500: "InternalServerError", 503: "ServiceUnavailableError"}


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


def _get(body: dict[str, Any], key: str, types: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise APIError(f"'{key}' must be {_names(types)}, got {value!r}", param=key)
    if not isinstance(value, types):
        raise APIError(f"'{key}' must be {_names(types)}, got {value!r:.80}", param=key)
    return value


def _names(types: type | tuple[type, ...]) -> str:
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in ts)


def validate_cache_salt(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise APIError("Parameter 'cache_salt' must be a non-empty string if provided.",
                       param="cache_salt")
    if len(value) > MAX_CACHE_SALT_CHARS:
        raise APIError(f"Parameter 'cache_salt' must be at most {MAX_CACHE_SALT_CHARS} "
                       f"characters, got {len(value)}", param="cache_salt")
    return value


def _token_ids(value: Any, key: str, vocab_size: int) -> list[int] | None:
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return None
    bad = next((t for t in value if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise APIError(f"token id {bad} in '{key}' is outside the vocabulary "
                       f"[0, {vocab_size})", param=key)
    return list(value)


def parse_generate(body: Any, *, chat: bool, model_name: str, vocab_size: int) -> GenerateParams:
    if not isinstance(body, dict):
        raise APIError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_name:
        raise APIError(f"The model `{model}` does not exist.", status=404, param="model")
    n = _get(body, "n", int, 1)
    if n != 1:
        raise APIError("only n=1 is supported", param="n")
    prompt_text = prompt_ids = messages = tools = None
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError("'messages' must be a non-empty list", param="messages")
        try:
            tools = check_tools(body.get("tools"))
        except ChatFormatError as exc:
            raise APIError(str(exc), param="tools") from exc
        max_tokens = _get(body, "max_completion_tokens", int, None)
        max_tokens = _get(body, "max_tokens", int, max_tokens)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one prompt
        if isinstance(prompt, str):
            if not prompt:
                raise APIError("'prompt' must not be empty", param="prompt")
            prompt_text = prompt
        else:
            prompt_ids = _token_ids(prompt, "prompt", vocab_size)
            if prompt_ids is None:
                raise APIError("'prompt' must be a non-empty string or a list of token ids "
                               "(one prompt per request)", param="prompt")
        max_tokens = _get(body, "max_tokens", int, 16)
    if max_tokens is not None and max_tokens < 1:
        raise APIError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    temperature = float(_get(body, "temperature", (int, float), 1.0))
    if temperature < 0:
        raise APIError(f"temperature must be >= 0, got {temperature}", param="temperature")
    stream = bool(_get(body, "stream", bool, False))
    options = _get(body, "stream_options", dict, {})
    include_usage = bool(options.get("include_usage", False))
    stop = _get(body, "stop", (str, list), [])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a string or a list of non-empty strings", param="stop")
    stop_ids = _get(body, "stop_token_ids", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
        raise APIError("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    return GenerateParams(
        chat=chat,
        prompt_text=prompt_text,
        prompt_ids=prompt_ids,
        messages=messages,
        tools=tools,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=_get(body, "seed", int, None),
        stream=stream,
        include_usage=include_usage,
        ignore_eos=bool(_get(body, "ignore_eos", bool, False)),
        cache_salt=validate_cache_salt(body.get("cache_salt")),
        stop=tuple(stop),
        stop_token_ids=tuple(stop_ids),
    )


def context_error(num_prompt: int, max_tokens: int, max_model_len: int) -> APIError:
    return APIError(
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {num_prompt + max_tokens} tokens ({num_prompt} in the messages, "
        f"{max_tokens} in the completion). Please reduce the length of the messages or "
        f"completion.",
        param="max_tokens" if num_prompt < max_model_len else "messages",
    )


def usage(num_prompt: int, num_output: int, num_cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
        "prompt_tokens_details": {"cached_tokens": max(0, num_cached)},
    }
