"""Chat content parts that are not text (images, audio, video): checked, and stood in for
in the prompt by a placeholder derived from their content.

The gateway and the engine read a multimodal request as text: neither fetches an image nor
decodes audio. What routing and prefix caching need is that content which changes a
replica's KV changes the prompt they key on, and that the same content keys the same. So
each part is replaced, where it stands in its message, by a run like
``<|image:3f2a...|>``: the kind, and the first 128 bits of the SHA-256 of what identifies
the content (the URL as given, which for a ``data:`` URI is the bytes themselves; an
audio part's base64 data and format). Two requests that differ only in their image then
differ from that point on; the same image shares the prefix. The cost is bounded: hashing
is linear in the part's size and nothing of the part is tokenized (the placeholder is a
fixed 42 characters).

Parts accepted (OpenAI's chat shapes, as vLLM serves them)::

    {"type": "image_url", "image_url": {"url": "https://... or data:image/png;base64,..."}}
    {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}
    {"type": "video_url", "video_url": {"url": "https://..."}}
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from typing import Any

import orjson

DIGEST_HEX_CHARS = 32  # 128 bits of SHA-256: no two contents share a placeholder
_NO_DIGEST = "0" * DIGEST_HEX_CHARS

# the part's type -> (the object it carries, the placeholder's kind)
_KINDS = {"image_url": "image", "input_audio": "audio", "video_url": "video",
          "audio_url": "audio", "image_embeds": "image"}
TYPES = frozenset(_KINDS)
# a part without ``type`` carries one of these keys (vLLM reads such parts too), its value
# the URL itself (or the embeddings)
UNTYPED_KEYS = ("image_url", "audio_url", "input_audio", "image_embeds", "video_url")
_UNTYPED = frozenset(UNTYPED_KEYS)
_SCHEMES = ("http://", "https://", "data:", "file://")


def shown(value: Any, limit: int = 60) -> str:
    """``value`` as an error message names it, in about ``limit`` characters and at no
    more cost: a string's start, a number, an array's length, an object's first keys.
    Never a whole ``repr``, which costs a huge value's size and overflows the stack on
    a deeply nested one (JSON allows 1,024 levels; ``repr`` stops near 1,000)."""
    if isinstance(value, str):
        return repr(value[:limit]) + ("..." if len(value) > limit else "")
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, list):
        return f"an array of {len(value)}"
    if isinstance(value, Mapping):
        keys = ", ".join(repr(str(k)[:20]) for k in itertools.islice(value, 4))
        return f"an object {{{keys}{', ...' if len(value) > 4 else ''}}}"
    return type(value).__name__


class MediaPartError(ValueError):
    """A media part is malformed; ``field`` is the path of the bad field (as the client
    wrote the request: ``messages[0].content[1].image_url.url``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field


def _string(value: Any, field: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise MediaPartError(field, f"must be a non-empty string ({what})")
    return value


def _identity(part: Mapping[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
    """The placeholder's kind and the strings that identify the part's content; raises
    MediaPartError naming the first bad field."""
    untyped = part.get("type") is None
    kind = media_type(part)
    assert kind is not None
    inner = part.get(kind)
    if kind == "image_embeds":  # base64 tensors, or a map of them: their text identifies
        if not isinstance(inner, str | Mapping) or not inner:
            raise MediaPartError(f"{where}.{kind}", "must be a non-empty string or object")
        return _KINDS[kind], (inner if isinstance(inner, str) else
                              _json_digest(inner).hexdigest(),)
    if untyped and isinstance(inner, str) and kind != "input_audio":
        inner = {"url": inner}  # {"image_url": "<url>"}: the URL itself
    if not isinstance(inner, Mapping):
        raise MediaPartError(f"{where}.{kind}", "must be an object")
    if kind == "input_audio":
        data = _string(inner.get("data"), f"{where}.{kind}.data", "the audio, base64")
        fmt = _string(inner.get("format"), f"{where}.{kind}.format", "e.g. 'wav' or 'mp3'")
        return _KINDS[kind], (fmt, data)
    url = _string(inner.get("url"), f"{where}.{kind}.url",
                  "an http(s) or file URL, or a data: URI")
    if not url.startswith(_SCHEMES):
        raise MediaPartError(f"{where}.{kind}.url",
                             f"must be an http(s) or file URL, or a data: URI, got {url[:40]!r}")
    return _KINDS[kind], (url,)


def placeholder(part: Mapping[str, Any], where: str, digest: bool = True) -> str:
    """The text that stands for media ``part`` (its ``type`` one of :data:`TYPES`, or no
    ``type`` and one of :data:`UNTYPED_KEYS`) at
    ``where`` (its path, for errors). With ``digest`` False the part is only checked and
    the placeholder has the same length with a zero digest (for checks and length
    estimates that must not hash megabytes)."""
    kind, identity = _identity(part, where)
    if not digest:
        return f"<|{kind}:{_NO_DIGEST}|>"
    h = hashlib.sha256()
    for piece in identity:
        h.update(piece.encode())
        h.update(b"\0")  # ("wa", "vX") and ("wav", "X") hash apart
    return f"<|{kind}:{h.hexdigest()[:DIGEST_HEX_CHARS]}|>"


def opaque_placeholder(part: Mapping[str, Any], digest: bool = True) -> str:
    """The text that stands for a content part read as a whole: a part of a type the
    gateway does not know (or cannot read) but forwards for its replica to judge. Its
    digest is of the part's JSON with sorted keys, so the same part keys the same."""
    if not digest:
        return f"<|part:{_NO_DIGEST}|>"
    return f"<|part:{_json_digest(part).hexdigest()[:DIGEST_HEX_CHARS]}|>"


def _json_digest(value: Any) -> Any:
    """A SHA-256 of ``value`` as JSON with sorted keys, of any size or depth."""
    try:
        return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
    except TypeError:  # what orjson cannot write (nested past 254 levels, a huge integer)
        return _walked_digest(value)


def _walked_digest(value: Any) -> Any:
    """A SHA-256 of ``value`` walked without recursion (any depth), keys sorted; each
    item is tagged with its kind and length, so no two values write the same bytes."""
    h = hashlib.sha256()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            h.update(b"{%d;" % len(item))
            for key in sorted(item, key=str, reverse=True):  # popped in sorted order
                stack.append(item[key])
                stack.append(str(key))
        elif isinstance(item, list | tuple):
            h.update(b"[%d;" % len(item))
            stack.extend(reversed(item))
        else:
            raw = (item.encode(errors="surrogatepass") if isinstance(item, str)
                   else f"{type(item).__name__}:{item!r}".encode())
            h.update(b"%d;" % len(raw) + raw)
    return h


def carries_media(messages: Any) -> bool:
    """Whether any message has a media part. Cheap for the event loop at any size (a 16 MB
    chat holds millions of messages or parts): the messages and their parts are read by
    C-level passes (``_has_media``), one by one only where those cannot tell."""
    if not isinstance(messages, list):
        return False
    try:  # every message an object (dict), as in a parsed body
        contents: list[Any] = list(map(dict.get, messages, itertools.repeat("content")))
    except TypeError:  # a message of another kind
        return any(isinstance(m, Mapping) and isinstance(c := m.get("content"), list)
                   and _has_media(c) for m in messages)
    lists = itertools.compress(contents, map(issubclass, map(type, contents),
                                             itertools.repeat(list)))
    return _has_media(list(itertools.chain.from_iterable(lists)))


def _has_media(parts: list[Any]) -> bool:
    """Whether a media part is among ``parts`` (one ``media_type`` names): the set of their
    ``type`` values, then, only where some part has none, whether any part has one of
    :data:`UNTYPED_KEYS` (stopping at the first); part by part only past both."""
    try:  # every part an object (dict) whose ``type`` is hashable, as in a parsed body
        kinds = set(map(dict.get, parts, itertools.repeat("type")))
    except TypeError:  # a part of another kind
        return any(media_type(p) is not None for p in parts)
    if not TYPES.isdisjoint(kinds):
        return True
    return None in kinds and not _UNTYPED.isdisjoint(itertools.chain.from_iterable(parts)) \
        and any(media_type(p) is not None for p in parts)


def media_type(part: Any) -> str | None:
    """The media type of a content part (one of :data:`TYPES`, its ``type`` or, without
    one, the key it carries), else None."""
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind is None:
        if _UNTYPED.isdisjoint(part):  # most parts: one C-level pass over its keys
            return None
        return next((k for k in UNTYPED_KEYS if part.get(k) is not None), None)
    return kind if isinstance(kind, str) and kind in TYPES else None
