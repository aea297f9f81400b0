"""The OpenAI request fields both servers read, their rules, and the one error body.

Errors a client sees are ``{"error": {"message", "type", "param", "code"}}`` with OpenAI's
types (``invalid_request_error``, ``authentication_error``, ``server_error`` ...) and a
string ``code`` or null. Every error raised while handling a request is an
:class:`OpenAIError`; the request edge (``kvwire.request_edge``) turns it into that body.

:func:`parse_fields` checks the fields the gateway routes on and the engine serves from
(model, stream, token limits, cache salt, prompt or chat messages, tools and
chat_template_kwargs). The gateway validates with it and forwards the client's bytes
unchanged; the engine adds its own sampling fields on top (:func:`optional` reads them
with the same rules).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import orjson

from kvwire.chat_messages import ChatFormatError, check_tools, normalize_messages
from kvwire.media_parts import DIGEST_HEX_CHARS, shown
from kvwire.template_kwargs import TemplateKwargsError, request_template_kwargs

T = TypeVar("T")

MAX_CACHE_SALT_CHARS = 128  # vLLM's limit on ``cache_salt``
MAX_TOKEN_ID = (1 << 32) - 1


# -- errors -------------------------------------------------------------------------------


class OpenAIError(Exception):
    """An error the client sees as ``{"error": {"message", "type", "param", "code"}}``;
    ``kind`` labels it in error counters."""

    status = 500
    type = "server_error"
    kind = "internal"
    # headers every answer of this class carries; ``headers`` given add to them (and win)
    class_headers: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = {**self.class_headers, **(headers or {})}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class BadRequest(OpenAIError):
    status = 400
    type = "invalid_request_error"
    kind = "bad_request"


class Unauthorized(OpenAIError):
    """A request without the credential it needs, answered with ``WWW-Authenticate:
    Bearer``: a 401 names the scheme that would admit it (RFC 9110, RFC 6750), and every
    credential both servers ask for is a bearer token."""

    status = 401
    type = "authentication_error"
    kind = "unauthorized"
    class_headers = MappingProxyType({"www-authenticate": "Bearer"})


class NotFound(OpenAIError):
    status = 404
    type = "invalid_request_error"
    kind = "not_found"


class MethodNotAllowed(OpenAIError):
    status = 405
    type = "invalid_request_error"
    kind = "bad_request"


class PayloadTooLarge(OpenAIError):
    status = 413
    type = "invalid_request_error"
    kind = "too_large"


class RequestTimeout(OpenAIError):
    """The request body did not arrive whole in time."""

    status = 408
    type = "invalid_request_error"
    kind = "body_timeout"


class UnsupportedMediaType(OpenAIError):
    status = 415
    type = "invalid_request_error"
    kind = "bad_request"


class ClientDisconnected(OpenAIError):
    """The client left before the answer began (nginx's 499); nobody reads the body."""

    status = 499
    type = "invalid_request_error"
    kind = "client_disconnect"


class TooManyRequests(OpenAIError):
    status = 429
    type = "rate_limit_error"
    kind = "rate_limited"


class ServiceUnavailable(OpenAIError):
    status = 503
    type = "service_unavailable"
    kind = "unavailable"


# -- fields -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestFields:
    """The checked fields of a completions or chat body. A completions prompt is a batch:
    ``prompt_text``/``prompt_ids`` hold its first prompt, ``num_prompts`` its size."""

    body: Mapping[str, Any]
    model: str | None
    stream: bool
    max_tokens: int | None
    cache_salt: str | None
    prompt_text: str | None = None
    prompt_ids: list[int] | None = None
    num_prompts: int = 1
    messages: list[Any] | None = None
    tools: list[Any] | None = None
    # a chat's extra chat template variables (``kvwire.template_kwargs``)
    chat_template_kwargs: dict[str, Any] | None = None


_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which Python's json (vLLM's) skips
# The body ``decode_json`` read last in this context (a request's task, or one call in a
# worker thread; ``checked_as_sent`` sets it for checks run apart from the decoding):
# orjson reads an integer literal past 64 bits as a float, and an error naming such a
# value finds the literal here again (``_as_sent``). Held in a box that a body decoded on
# an event loop empties at the loop's next turn: its checks run in the same turn, right
# after the decoding, and a request's task no longer holds the body's bytes for the rest
# of the request, outside a server's held bytes (counted only until it is parsed)
_DECODED: ContextVar[list[bytes] | None] = ContextVar("kvwire_decoded_body", default=None)


def decode_json(raw: bytes) -> Any:
    """The JSON value of ``raw``; BadRequest where it is none. Checks of it run in the same
    turn of an event loop (or the same worker thread's call) name an integer past 64 bits
    as it was sent; any other runs them in ``checked_as_sent``."""
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:  # also raised for invalid UTF-8
        raise BadRequest(f"request body is not valid JSON: {_not_utf8(raw) or exc}",
                         code="invalid_json") from exc
    box = [raw]
    _DECODED.set(box)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        # no loop in this thread: a worker thread's call, which ``to_thread`` runs in a
        # context of its own, dropped after it
        return decoded
    loop.call_soon(box.clear)
    return decoded


def checked_as_sent(raw: bytes, check: Callable[[], T]) -> T:
    """``check()``, a check of the body decoded from ``raw`` that runs apart from its
    decoding (in another worker thread, or on the event loop after a thread decoded it:
    a value set in one thread's call never reaches another's), with ``raw`` as the body
    decoded last, so that its errors name an integer past 64 bits as it was sent, as
    those of a check run where it was decoded do."""
    token = _DECODED.set([raw])
    try:
        return check()
    finally:
        _DECODED.reset(token)


def _not_utf8(raw: bytes) -> str | None:
    """Where ``raw`` is no UTF-8, as an error names it (orjson says "surrogates not
    allowed" at its first byte, whatever the fault and wherever it is); None when it is
    UTF-8."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"it is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}: " \
               f"{exc.reason})"
    return None


def json_object(raw: bytes) -> dict[str, Any]:
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return body


def optional(body: Mapping[str, Any], key: str, types: type | tuple[type, ...],
             default: Any) -> Any:
    """``body[key]`` if it has one of ``types`` (a bool is no int) or reads as one
    (:func:`_lax`), ``default`` when absent or null; else BadRequest naming the key. An int
    (but not a number) field's value must fit a signed 64-bit integer."""
    value = body.get(key)
    if value is None:
        return default
    allowed = types if isinstance(types, tuple) else (types,)
    read = value
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        read = _lax(value, allowed)
        if read is None:
            names = " or ".join(t.__name__ for t in allowed)
            raise BadRequest(f"'{key}' must be {names}, got {shown(value, 80)}", param=key)
    if int in allowed and float not in allowed \
            and _beyond_int64(value if isinstance(value, float) else read):
        raise BadRequest(f"'{key}' must be a signed 64-bit integer (-2**63 to 2**63 - 1), "
                         f"got {_as_sent(key, value)}", param=key)
    return read


# an integer literal of more digits than this is named by its size and magnitude
_SHOWN_DIGITS = 40


def _as_sent(key: str, value: Any) -> str:
    """``value``, the body's ``key``, as an error names it: a float read from an integer
    literal (one past 64 bits: orjson reads those as floats) by that literal's digits, or
    past ``_SHOWN_DIGITS`` how many and the magnitude; else ``shown``."""
    literal = _integer_literal(key, value) if isinstance(value, float) else None
    if literal is None:
        return shown(value, 80)
    digits = len(literal.lstrip(b"-"))
    if digits <= _SHOWN_DIGITS:
        return literal.decode()
    size = f"an integer of {digits} digits"
    return f"{size}, about {value:.6g}" if math.isfinite(value) else size


def _integer_literal(key: str, value: float) -> bytes | None:
    """The integer literal orjson read as ``value`` for a field ``key`` of the body
    ``decode_json`` read last here; None when there is none, or more than one (the same
    key in other objects, their values alike as floats): never another field's."""
    field = re.compile(rb'"%s"[ \t\r\n]*:[ \t\r\n]*(-?[0-9]+)(?![0-9.eE])'
                       % re.escape(key.encode()))
    box = _DECODED.get()
    body = box[0] if box else b""
    found = {m[1] for m in field.finditer(body) if float(m[1]) == value}
    return found.pop() if len(found) == 1 else None


# pydantic's lax booleans (vLLM's request models)
_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
_FALSE = frozenset({"false", "0", "no", "off", "f", "n"})
# an integer as pydantic reads one from a string: ASCII digits, one sign, and no more
# digits than Python converts (4,300)
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,4300}")
_INT64_END = 1 << 63  # an int field holds [-2**63, 2**63), as pydantic's int


def _beyond_int64(value: Any) -> bool:
    """Whether pydantic refuses ``value`` as an int (``int_parsing_size``): a float outside
    (-2**63, 2**63), or an integer outside [-2**63, 2**63 - 1]. Stricter than pydantic for
    an integer (it takes any), as orjson reads one past 64 bits as a float: 10**300 sent
    is no integer we could tell from 1e300 sent."""
    if isinstance(value, float):
        return not -_INT64_END < value < _INT64_END
    return isinstance(value, int) and not isinstance(value, bool) \
        and not -_INT64_END <= value < _INT64_END


def _lax(value: Any, allowed: tuple[type, ...]) -> Any:
    """``value`` read as one of ``allowed`` the way vLLM's request models (pydantic, lax)
    read it: ``3.0`` or ``"3"`` as an int, ``"0.5"`` as a float, ``"true"`` as a bool;
    None when it cannot be."""
    if isinstance(value, bool):
        return None
    if int in allowed:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
            return int(value)
    if float in allowed and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    if bool in allowed and isinstance(value, str | int):
        text = str(value).strip().lower()
        return True if text in _TRUE else False if text in _FALSE else None
    return None


def positive_int(body: Mapping[str, Any], key: str, least: int = 1) -> int | None:
    value = optional(body, key, int, None)
    if value is not None and value < least:
        kind = "a positive integer" if least == 1 else f"an integer of at least {least}"
        raise BadRequest(f"'{key}' must be {kind}, got {value!r}", param=key)
    return value


# of a model's name in an error: a body may hold megabytes of it
MODEL_SHOWN_CHARS = 256


def model_field(body: Mapping[str, Any]) -> str | None:
    """The request's ``model``: a string, None when absent or empty (an empty name is the
    served model's, as vLLM reads it)."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {shown(model)}", param="model")
    return model or None


def check_served(model: str | None, served: str) -> None:
    """OpenAI's 404 for a request naming a model other than the one ``served`` (its name's
    first ``MODEL_SHOWN_CHARS``: a body may hold megabytes of it)."""
    if model is not None and model != served:
        named = model if len(model) <= MODEL_SHOWN_CHARS else model[:MODEL_SHOWN_CHARS] + "..."
        raise NotFound(f"The model `{named}` does not exist.", param="model",
                       code="model_not_found")


def check_cache_salt(value: Any) -> str | None:
    """The salt rule: absent, or a non-empty string of at most 128 characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_CACHE_SALT_CHARS:
        raise BadRequest(f"'cache_salt' must be a non-empty string of at most "
                         f"{MAX_CACHE_SALT_CHARS} characters, got {shown(value)}",
                         param="cache_salt")
    return value


def parse_fields(body: Any, *, chat: bool, lenient: bool = False) -> RequestFields:
    """The fields every request is checked for. ``lenient`` (the gateway, which forwards
    the body for its replica to judge): content parts it does not know stand in by a
    digest (``normalize_messages``), and a completion may carry ``prompt_embeds``
    instead of ``prompt`` (vLLM's ``--enable-prompt-embeds``), read as a placeholder
    derived from them; not ``lenient`` (the engine, which takes no embeddings), a
    completion carrying ``prompt_embeds`` is refused."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    model = model_field(body)
    optional(body, "user", str, None)  # an end user's id: vLLM's request models take a string
    stream = bool(optional(body, "stream", bool, False))
    # a completion that echoes its prompt may ask for no token (vLLM answers the prompt
    # alone: a loglikelihood client's request)
    echo = not chat and bool(optional(body, "echo", bool, False))  # read as the engine does
    max_tokens = positive_int(body, "max_tokens", 0 if echo else 1)
    salt = check_cache_salt(body.get("cache_salt"))
    if not chat:
        embeds = body.get("prompt_embeds")
        if embeds is not None and not lenient:  # never dropped beside a prompt: refused
            raise BadRequest("'prompt_embeds' is not supported: this engine takes a prompt "
                             "as text or token ids (vLLM too refuses it unless started "
                             "with --enable-prompt-embeds)", param="prompt_embeds")
        text: str | None
        if embeds is not None and body.get("prompt") is None:
            text, ids, count = _embeds_prompt(embeds)
        else:
            text, ids, count = _prompt(body.get("prompt"))
        return RequestFields(body, model, stream, max_tokens, salt, text, ids, count)
    # a chat's field only: vLLM's completion request has none, and ignores one sent
    max_completion_tokens = positive_int(body, "max_completion_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest(f"'messages' must be a non-empty array, got {shown(messages)}",
                         param="messages")
    try:
        # checked here, hashed when rendered
        normalize_messages(messages, hash_media=False, lenient=lenient)
    except ChatFormatError as exc:
        raise BadRequest(str(exc), param=exc.param or "messages") from exc
    try:
        tools = check_tools(body.get("tools"))
    except ChatFormatError as exc:
        raise BadRequest(str(exc), param=exc.param or "tools") from exc
    try:
        template_kwargs = request_template_kwargs(body)
    except TemplateKwargsError as exc:
        raise BadRequest(str(exc), param=exc.param) from exc
    # as OpenAI and vLLM: max_completion_tokens (max_tokens' successor) wins over it
    limit = max_completion_tokens if max_completion_tokens is not None else max_tokens
    return RequestFields(body, model, stream, limit, salt, messages=messages, tools=tools,
                         chat_template_kwargs=template_kwargs)


def is_token_ids(value: Any) -> bool:
    """A list of token ids (integers 0..MAX_TOKEN_ID; a bool is none), maybe empty."""
    return isinstance(value, list) and all(map(_is_token_id, value))


def _embeds_prompt(embeds: Any) -> tuple[str, None, int]:
    """(placeholder text, None, number of prompts) of a ``prompt_embeds`` field: one
    base64 tensor or a list of them, the first one's digest standing for its prompt."""
    first = embeds[0] if isinstance(embeds, list) and embeds else embeds
    if not isinstance(first, str) or not first \
            or (isinstance(embeds, list) and not all(isinstance(e, str) for e in embeds)):
        raise BadRequest(f"'prompt_embeds' must be a base64 string or an array of them, "
                         f"got {shown(embeds)}", param="prompt_embeds")
    digest = hashlib.sha256(first.encode()).hexdigest()[:DIGEST_HEX_CHARS]
    return f"<|embeds:{digest}|>", None, len(embeds) if isinstance(embeds, list) else 1


def _prompt(prompt: Any) -> tuple[str | None, list[int] | None, int]:
    """(first prompt's text, or its token ids, number of prompts) of a prompt field."""
    if prompt is None:
        raise BadRequest("'prompt' is required", param="prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("'prompt' must not be empty", param="prompt")
        return prompt, None, 1
    if isinstance(prompt, list) and prompt:
        if is_token_ids(prompt):
            return None, list(prompt), 1
        if all(isinstance(p, str) for p in prompt):
            empty = next((i for i, p in enumerate(prompt) if not p), None)
            if empty is not None:  # which of the prompts, as the client wrote it
                raise BadRequest(f"prompt[{empty}] must not be empty", param=f"prompt[{empty}]")
            return prompt[0], None, len(prompt)
        if all(is_token_ids(p) and p for p in prompt):
            return None, list(prompt[0]), len(prompt)
    raise BadRequest(
        "'prompt' must be a non-empty string, array of strings, array of token ids "
        f"(integers 0..{MAX_TOKEN_ID}) or array of token id arrays, got {_bad_prompt(prompt)}",
        param="prompt")


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def _bad_prompt(prompt: Any) -> str:
    """What a refused prompt holds that no kind of prompt takes: the first such item of
    an array (``prompt[2] = -1``), else the prompt itself."""
    if not isinstance(prompt, list) or not prompt:
        return shown(prompt)
    for i, item in enumerate(prompt):
        if isinstance(item, str) or _is_token_id(item):
            continue
        if not isinstance(item, list) or not item:
            return f"prompt[{i}] = {shown(item)}"
        j = next((j for j, t in enumerate(item) if not _is_token_id(t)), None)
        if j is not None:
            return f"prompt[{i}][{j}] = {shown(item[j])}"
    return "an array mixing strings, token ids and token id arrays"
