"""The wire shapes of ``POST /v1/embeddings``: the request (OpenAI's fields plus vLLM's
``truncate_prompt_tokens``), the checks on its token ids, and the response body.

Shapes follow vLLM's OpenAI server (``EmbeddingCompletionRequest``/``EmbeddingResponse``):

    request:  {"model"?, "input": str | [str] | [int] | [[int]],
               "encoding_format"?: "float" | "base64", "dimensions"?: int,
               "user"?: ignored, "truncate_prompt_tokens"?: -1 | int >= 1}
    response: {"id": "embd-...", "object": "list", "created", "model",
               "data": [{"index": i, "object": "embedding", "embedding": [float] | str}],
               "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
                         "prompt_tokens_details": null}}

``base64`` is the little-endian float32 bytes of the vector (what the ``openai`` client
asks for by default and decodes with ``numpy.frombuffer(..., "float32")``). Limits are
OpenAI's: at most 2048 inputs and 300,000 tokens in all per request; each input at most
``max_model_len`` tokens (vLLM's wording for the error).
"""

from __future__ import annotations

import array
import base64
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from engine.sim_embedding import SimEmbedder
from kvwire.media_parts import shown
from kvwire.openai_schema import (
    MAX_TOKEN_ID,
    BadRequest,
    check_served,
    is_token_ids,
    model_field,
    optional,
    positive_int,
)

MAX_INPUTS = 2048
MAX_TOTAL_TOKENS = 300_000
ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbeddingParams:
    """A validated embeddings request, before tokenization: ``texts`` or ``token_ids``
    (one entry per input, in order)."""

    texts: tuple[str, ...] | None
    token_ids: tuple[tuple[int, ...], ...] | None
    encoding_format: str
    dimensions: int | None
    truncate_prompt_tokens: int | None


def parse_embedding(body: Any, *, model_name: str) -> EmbeddingParams:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    check_served(model_field(body), model_name)
    texts, ids = _inputs(body.get("input"))
    fmt = optional(body, "encoding_format", str, "float")
    if fmt not in ENCODING_FORMATS:
        raise BadRequest(f"'encoding_format' must be one of {list(ENCODING_FORMATS)}, got "
                         f"{shown(fmt)}", param="encoding_format")
    dims = positive_int(body, "dimensions")
    truncate = optional(body, "truncate_prompt_tokens", int, None)
    if truncate is not None and truncate != -1 and truncate < 1:
        raise BadRequest(f"'truncate_prompt_tokens' must be -1 or a positive integer, got "
                         f"{truncate}", param="truncate_prompt_tokens")
    return EmbeddingParams(texts, ids, fmt, dims, truncate)


def _inputs(value: Any) -> tuple[tuple[str, ...] | None, tuple[tuple[int, ...], ...] | None]:
    if value is None:
        raise BadRequest("'input' is required", param="input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BadRequest("'input' must be a non-empty string, array of strings, array of "
                         f"token ids or array of token id arrays, got {shown(value)}",
                         param="input")
    if len(value) > MAX_INPUTS and not is_token_ids(value):
        raise BadRequest(f"'input' has {len(value)} inputs; at most {MAX_INPUTS} are "
                         "allowed per request", param="input")
    if all(isinstance(v, str) for v in value):
        empty = next((i for i, v in enumerate(value) if not v), None)
        if empty is not None:
            raise BadRequest(f"input {empty} is an empty string", param="input")
        return tuple(value), None
    if is_token_ids(value):
        return None, (tuple(value),)
    if all(isinstance(v, list) for v in value):
        for i, v in enumerate(value):
            if not v or not is_token_ids(v):
                j, bad = next(((j, t) for j, t in enumerate(v) if not is_token_ids([t])),
                              (0, None))
                got = f", got {shown(bad)} at input[{i}][{j}]" if v else ", got []"
                raise BadRequest(f"input {i} must be a non-empty array of token ids "
                                 f"(integers 0..{MAX_TOKEN_ID}){got}", param="input")
        return None, tuple(tuple(v) for v in value)
    i, bad = _first_misfit(value)
    raise BadRequest("'input' must be a string, an array of strings, an array of token ids "
                     f"(integers 0..{MAX_TOKEN_ID}) or an array of token id arrays, got "
                     f"{shown(bad)} at input[{i}]", param="input")


def _first_misfit(value: list[Any]) -> tuple[int, Any]:
    """The index and value of the first entry of ``value`` that is not of the shape of
    its first entry (a string, an array, or a token id), or the first entry itself
    where that is of none of them."""
    first = value[0]
    if isinstance(first, str):
        return next((i, v) for i, v in enumerate(value) if not isinstance(v, str))
    if isinstance(first, list):
        return next((i, v) for i, v in enumerate(value) if not isinstance(v, list))
    return next((i, v) for i, v in enumerate(value) if not is_token_ids([v]))


def embedding_keep(params: EmbeddingParams, max_model_len: int) -> int | None:
    """The input tokens ``truncate_prompt_tokens`` keeps (the last ones): -1
    ``max_model_len``, None all; more than the model's context is a BadRequest."""
    keep = params.truncate_prompt_tokens
    if keep == -1:
        keep = max_model_len
    if keep is not None and keep > max_model_len:
        raise BadRequest(f"truncate_prompt_tokens value ({keep}) is greater than "
                         f"max_model_len ({max_model_len}); choose a smaller truncation "
                         "size", param="truncate_prompt_tokens")
    return keep


def embedding_context_error(num_tokens: int, max_model_len: int, at_least: bool = False
                            ) -> BadRequest:
    """An input longer than the context, in vLLM's words; ``at_least``: ``num_tokens`` is a
    count the input reaches (refused before it was encoded whole)."""
    least = "at least " if at_least else ""
    return BadRequest(
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {least}{num_tokens} tokens in the input for embedding generation. "
        "Please reduce the length of the input.", param="input")


def checked_ids(params: EmbeddingParams, encoded: Sequence[Sequence[int]], *,
                max_model_len: int, vocab_size: int) -> list[list[int]]:
    """Each input's token ids, truncated as asked (the last tokens kept, as vLLM does)
    and checked: non-empty, in the vocabulary, within the context and the request's
    token budget. BadRequest naming the field otherwise."""
    keep = embedding_keep(params, max_model_len)
    out: list[list[int]] = []
    total = 0
    for i, ids in enumerate(encoded):
        ids = list(ids[-keep:]) if keep is not None else list(ids)
        if not ids:
            raise BadRequest(f"input {i} encodes to zero tokens", param="input")
        if len(ids) > max_model_len:
            raise embedding_context_error(len(ids), max_model_len)
        bad = next((t for t in ids if t >= vocab_size), None)
        if bad is not None:
            raise BadRequest(f"token id {bad} in input {i} is outside the vocabulary "
                             f"[0, {vocab_size})", param="input")
        total += len(ids)
        if total > MAX_TOTAL_TOKENS:
            raise too_many_in_all(i, total)
        out.append(ids)
    return out


def too_many_in_all(index: int, at_least: int) -> BadRequest:
    """The refusal of inputs holding more than ``MAX_TOTAL_TOKENS`` in all: inputs
    0..``index`` hold ``at_least`` tokens at least."""
    return BadRequest(f"inputs 0..{index} hold at least {at_least} tokens, more than "
                      f"{MAX_TOTAL_TOKENS} tokens in all; send fewer per request",
                      param="input")


def check_dimensions(params: EmbeddingParams, embedder: SimEmbedder) -> None:
    if params.dimensions is not None and params.dimensions > embedder.dim:
        raise BadRequest(f"'dimensions' must be at most {embedder.dim} for this model, got "
                         f"{params.dimensions}", param="dimensions")


def encode_vector(vec: Sequence[float], encoding_format: str) -> list[float] | str:
    """The vector as the response carries it: floats, or base64 of float32 LE bytes."""
    if encoding_format == "float":
        return list(vec)
    packed = array.array("f", vec)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def render_response(*, request_id: str, model: str, params: EmbeddingParams,
                    embedder: SimEmbedder, token_ids: Sequence[Sequence[int]]) -> bytes:
    """Embed every input and serialise the response body (CPU work: run it in a thread)."""
    data = [{"index": i, "object": "embedding",
             "embedding": encode_vector(embedder.embed(ids, params.dimensions),
                                        params.encoding_format)}
            for i, ids in enumerate(token_ids)]
    n = sum(len(ids) for ids in token_ids)
    return orjson.dumps({
        "id": request_id, "object": "list", "created": int(time.time()), "model": model,
        "data": data,
        "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
                  "prompt_tokens_details": None},
    })
