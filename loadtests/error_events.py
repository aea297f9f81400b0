"""An OpenAI-style error, as a stream's event or a whole answer tells it: nested under
``error`` (OpenAI's, vLLM's since 0.10.2) or flat beside ``"object": "error"`` (older
vLLM's, SGLang's). Read by the load clients and the timing probe alike."""

from __future__ import annotations

from typing import Any


def error_told(obj: Any, limit: int = 200) -> str | None:
    """The error ``obj`` tells, as text of at most ``limit`` characters; None when it
    tells none (no dict, or no error)."""
    if not isinstance(obj, dict):
        return None
    if "error" in obj:
        return str(obj["error"])[:limit]
    if obj.get("object") == "error":
        return str({k: v for k, v in obj.items() if k != "object"})[:limit]
    return None
