"""The server-sent events of a chat stream as vLLM writes them, to script a replica's
stream byte for byte: a chunk of one choice's delta, and the usage-only event."""

from __future__ import annotations

import json
from typing import Any


def event(value: dict[str, Any]) -> bytes:
    """``value`` as one ``data:`` event, its JSON compact."""
    return b"data: " + json.dumps(value, separators=(",", ":")).encode() + b"\n\n"


def chat(delta: dict[str, Any], finish: str | None = None, index: int = 0,
         **extra: Any) -> bytes:
    """A chat chunk of choice ``index``: its ``delta``, its finish reason (``finish``),
    and ``extra`` fields in the choice (SGLang's ``hidden_states``)."""
    return event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                  "model": "m", "choices": [{"index": index, "delta": delta,
                                             "logprobs": None, "finish_reason": finish,
                                             **extra}]})


def usage(pad: int = 0) -> bytes:
    """The usage-only event (its choices empty); ``pad`` characters of a long field."""
    extra = {"kv_transfer_params": {"pad": "p" * pad}} if pad else {}
    return event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                  "model": "m", "choices": [], **extra,
                  "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
