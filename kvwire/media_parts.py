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
from collections.abc import Mapping
from typing import Any

DIGEST_HEX_CHARS = 32  # 128 bits of SHA-256: no two contents share a placeholder
_NO_DIGEST = "0" * DIGEST_HEX_CHARS

# the part's type -> (the object it carries, the placeholder's kind)
_KINDS = {"image_url": "image", "input_audio": "audio", "video_url": "video"}
TYPES = frozenset(_KINDS)


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
    kind = part.get("type")
    assert isinstance(kind, str) and kind in _KINDS
    inner = part.get(kind)
    if not isinstance(inner, Mapping):
        raise MediaPartError(f"{where}.{kind}", "must be an object")
    if kind == "input_audio":
        data = _string(inner.get("data"), f"{where}.{kind}.data", "the audio, base64")
        fmt = _string(inner.get("format"), f"{where}.{kind}.format", "e.g. 'wav' or 'mp3'")
        return _KINDS[kind], (fmt, data)
    url = _string(inner.get("url"), f"{where}.{kind}.url",
                  "an http(s) URL or a data: URI")
    if not url.startswith(("http://", "https://", "data:")):
        raise MediaPartError(f"{where}.{kind}.url",
                             f"must be an http(s) URL or a data: URI, got {url[:40]!r}")
    return _KINDS[kind], (url,)


def placeholder(part: Mapping[str, Any], where: str, digest: bool = True) -> str:
    """The text that stands for media ``part`` (its ``type`` one of :data:`TYPES`) at
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


def carries_media(messages: Any) -> bool:
    """Whether any message has a media part (cheap: reads each part's ``type`` only)."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
                isinstance(p, Mapping) and isinstance(p.get("type"), str) and p["type"] in TYPES
                for p in content):
            return True
    return False
