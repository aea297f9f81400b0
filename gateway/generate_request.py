"""SGLang's native ``POST /generate``: the fields routing needs, and its usage.

A body carries its prompt as ``text`` (a string, or a batch of them) or as ``input_ids``
(token ids, or a batch of id lists); a batch is routed by its first prompt, as a
completions batch is. Any other prompt (``input_embeds``; none, both, an empty or a
malformed one) is routed by a digest of those fields and left for the replica to judge,
as SGLang's router leaves it. ``model`` is optional (SGLang serves one model per
server): without it the request is for the fleet's one model. ``lora_path`` names the LoRA
adapter the prompt runs under, and so the model it is routed for, as ``model`` names an
adapter on the OpenAI paths: only replicas that list the adapter get it, and its prompts
key apart from the base model's, as the replica caches them. A batch's list of adapters,
one per prompt, is routed by its first prompt's (an entry that is null or empty: the base
model), as the batch is; the replica judges the others. ``cache_salt`` keys the prompt
apart, as on the OpenAI paths. The media of the first prompt (``image_data``,
``video_data``, ``audio_data``: one item or a list of them, or in a batch one of those per
prompt) key it too, each by a digest of its value, put ahead of the prompt (a text's
placeholder runs, a few ids derived from the digest ahead of ``input_ids``), as a chat's
media parts key a chat: the same prompt with another image is another prompt to route
and cache. Other generation settings (``sampling_params``, ``return_logprob``...) are the
replica's to judge; of them only ``stream`` is read.

Every answer carries its counts in ``meta_info`` (``prompt_tokens``, ``cached_tokens``,
``completion_tokens``), a stream's in each event; ``counts_of`` and ``stream_counts`` read
them as OpenAI's ``usage`` is read, so calibration, metrics and the policies learn from
``/generate`` too.
A stream ends with ``data: [DONE]``, as OpenAI's do: without it, it was cut.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvwire.media_parts import opaque_placeholder
from kvwire.openai_schema import (
    BadRequest,
    RequestFields,
    check_cache_salt,
    is_token_ids,
    model_field,
    optional,
)

PATH = "/generate"
_PROMPT_FIELDS = ("text", "input_ids", "input_embeds")  # SGLang's, one of them a request's


def generate_fields(body: Any) -> RequestFields:
    """The fields of a ``/generate`` body the gateway acts on (``BadRequest`` naming a bad
    one): ``model``, ``stream``, ``cache_salt``, and the prompt to route by."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    model = model_field(body)
    stream = bool(optional(body, "stream", bool, False))
    salt = check_cache_salt(body.get("cache_salt"))
    text, ids, count = _prompt_of(body)
    media = _media_keys(body, _batched(body))
    if media:  # the first prompt's media key it, ahead of its text or ids
        if ids is not None:
            ids = [*_media_ids(media), *ids]
        else:
            text = "".join(media) + (text or "")
    return RequestFields(body, _adapter(body.get("lora_path")) or model, stream, None, salt,
                         prompt_text=text, prompt_ids=ids, num_prompts=count)


_MEDIA_FIELDS = ("image_data", "video_data", "audio_data")  # SGLang's
_MEDIA_ID_HEX = 7  # hex digits of a placeholder's digest per id: ids stay under 2**28
_MEDIA_IDS = 4  # ids per media item ahead of ``input_ids``


def model_param(body: Mapping[str, Any]) -> str:
    """The field of a ``/generate`` body that named its model: ``lora_path`` where it named
    an adapter (``_adapter``), else ``model`` (sent, or the fleet's one model)."""
    return "lora_path" if _adapter(body.get("lora_path")) else "model"


def _adapter(lora_path: Any) -> str | None:
    """The LoRA adapter named by ``lora_path``: a string, or a batch's list of them (its
    first prompt's); None (the base model) for none, null or empty, or a value of
    another type (left for the replica to judge)."""
    if isinstance(lora_path, list):
        lora_path = lora_path[0] if lora_path else None
    return lora_path if isinstance(lora_path, str) and lora_path else None


def _batched(body: dict[str, Any]) -> bool:
    """Whether the body's prompt is a batch (a list of texts, or of id lists)."""
    text, ids = body.get("text"), body.get("input_ids")
    return isinstance(text, list) or (isinstance(ids, list) and bool(ids)
                                      and isinstance(ids[0], list))


def _media_keys(body: dict[str, Any], batch: bool) -> list[str]:
    """A placeholder (``opaque_placeholder``: a digest of its value) for each media item
    of the first prompt, in field order then item order; in a batch a field's list holds
    one entry (an item, a list of items, or null) per prompt."""
    keys: list[str] = []
    for field in _MEDIA_FIELDS:
        value = body.get(field)
        if batch and isinstance(value, list):
            value = value[0] if value else None
        items = value if isinstance(value, list) else [value]
        keys.extend(opaque_placeholder({field: item}) for item in items
                    if item is not None and item != "")
    return keys


def _media_ids(keys: list[str]) -> list[int]:
    """Ids that stand for media placeholders ahead of ``input_ids``: ``_MEDIA_IDS`` per
    placeholder, read from its digest's hex digits (each under 2**28)."""
    ids: list[int] = []
    for key in keys:
        digest = key[key.index(":") + 1:-2]
        ids.extend(int(digest[i * _MEDIA_ID_HEX:(i + 1) * _MEDIA_ID_HEX], 16)
                   for i in range(_MEDIA_IDS))
    return ids


def _prompt_of(body: dict[str, Any]) -> tuple[str | None, list[int] | None, int]:
    """(the first prompt's text, or its token ids, the number of prompts). A prompt the
    gateway cannot read (none, both ``text`` and ``input_ids``, an empty or malformed one,
    ``input_embeds``) is routed by a digest of those fields, one prompt, and forwarded for
    the replica to judge, as SGLang's router forwards it."""
    text, ids = body.get("text"), body.get("input_ids")
    if ids is None:
        if isinstance(text, str) and text:
            return text, None, 1
        if isinstance(text, list) and text and all(isinstance(t, str) and t for t in text):
            return text[0], None, len(text)
    elif text is None:
        if ids and is_token_ids(ids):
            return None, list(ids), 1
        if isinstance(ids, list) and ids and all(p and is_token_ids(p) for p in ids):
            return None, list(ids[0]), len(ids)
    return opaque_placeholder({key: body.get(key) for key in _PROMPT_FIELDS}), None, 1


def counted_alike(body: Mapping[str, Any]) -> bool:
    """Whether the prompt tokens a ``/generate`` answer reports count the prompt once, as
    the gateway counts it: not where ``sampling_params.n`` asks several samples (SGLang
    answers each with the whole prompt's count), nor with media (the replica counts
    their tokens, the gateway a digest of them). Such an answer teaches the token
    calibration nothing."""
    params = body.get("sampling_params")
    n = params.get("n") if isinstance(params, dict) else None
    return n in (None, 1) and not any(body.get(field) for field in _MEDIA_FIELDS)


def counts_of(answer: Any) -> Mapping[str, Any] | None:
    """An answer's counts as OpenAI's ``usage`` names them (None: it has none): its
    ``meta_info``, or the sum over a batch's answers."""
    if isinstance(answer, list):
        parts = [counts_of(item) for item in answer]
        if not parts or any(p is None for p in parts):
            return None
        total: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0,
                                 "prompt_tokens_details": {"cached_tokens": 0}}
        for part in parts:
            assert part is not None
            for key in ("prompt_tokens", "completion_tokens"):
                total[key] = _add(total[key], part.get(key))
            total["prompt_tokens_details"]["cached_tokens"] = _add(
                total["prompt_tokens_details"]["cached_tokens"],
                part["prompt_tokens_details"]["cached_tokens"])
        return total
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    if not isinstance(meta, dict):
        return None
    return {"prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
            "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0)}}


META_KEY = b'"meta_info"'
META_HEAD_BYTES = 4096  # of an event's meta_info kept from its start: its counts come first
_COUNT_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens")
_COUNTS = re.compile(rb'"(prompt_tokens|completion_tokens|cached_tokens)"\s*:\s*(\d+)')


def stream_counts(tail: bytes, head: bytes = b"") -> Mapping[str, Any] | None:
    """The counts of a stream's last ``meta_info``: each count's last value in the
    ``head`` kept of that ``meta_info`` and then in the ``tail`` (the stream's last bytes:
    an event's cumulative text, and with log probabilities its ``meta_info`` too, may be
    longer than the tail). The keys are written once per ``meta_info``, and nowhere else
    unescaped, so the last of each is the last event's."""
    found = {key.decode(): int(value) for key, value in _COUNTS.findall(head + b"\n" + tail)}
    if "prompt_tokens" not in found:
        return None
    return counts_of({"meta_info": {key: found[key] for key in _COUNT_KEYS if key in found}})


def _add(a: Any, b: Any) -> Any:
    """``a + b`` for counts; None (no count) when either is not an int."""
    ok = all(isinstance(x, int) and not isinstance(x, bool) for x in (a, b))
    return a + b if ok else None
