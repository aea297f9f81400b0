"""OpenAI's Responses API (``POST /v1/responses``, served by vLLM and SGLang too) read as
the chat it carries, for routing.

A replica runs a Responses request as its model's chat over the same messages, so the
gateway routes it as that chat (``kvwire.responses_input``: ``instructions`` the system
message, then ``input``'s messages, function calls and their outputs, with the function
``tools`` in the chat's shape). The replica gets the body unchanged; the chat is rendered
only to find the prefix the replicas cache (an agent's long instructions and tools, and
the turns it sends again). ``previous_response_id`` names a response a replica
stored; the gateway keeps which replica answered each, and for which tenant
(``RESPONSE_HOMES`` of them), so such a request goes back there (no other replica can
continue it), and another tenant's is told the response does not exist, as for an id no
replica stores (``response_not_found``).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from kvwire.media_parts import shown
from kvwire.openai_schema import (
    BadRequest,
    NotFound,
    RequestFields,
    check_cache_salt,
    model_field,
    optional,
    positive_int,
)
from kvwire.responses_input import responses_chat

PATH = "/v1/responses"
RESPONSE_HOMES = 1 << 16  # the latest responses whose replica the gateway keeps


class ResponseHome(NamedTuple):
    """Where a stored response is (the replica that answered it) and whose it is (the
    tenant of the request that made it; None: the anonymous tenant's)."""

    replica: str
    tenant: str | None


def response_not_found(response: str) -> NotFound:
    """The answer to a continuation of ``response`` where no replica stores it, and where
    it is another tenant's: one answer for both (vLLM's message), so a tenant learns
    nothing of another's ids."""
    return NotFound(f"Response with id {shown(response)} not found.",
                    param="previous_response_id", code="response_not_found")


def _event_markers(*kinds: str) -> tuple[bytes, ...]:
    """Bytes that tell a stream's event of one of ``kinds``, each where only an event's
    own type stands: its ``event:`` line (after a line end: data is JSON, whose strings
    escape line ends and quotes), or its data's ``type`` as the first key (OpenAI's order)
    or the last (pydantic's, vLLM's). Anywhere else, ``"type": "error"`` may be a value
    the response echoes (its ``metadata``, its tools' schemas), not its event's type."""
    out: list[bytes] = []
    for kind in (kind.encode() for kind in kinds):
        for colon in (b":", b": "):
            typed = b'"type"' + colon + b'"' + kind + b'"'
            out += [b"\nevent" + colon + kind + b"\n", b"\nevent" + colon + kind + b"\r",
                    b'data:{' + typed, b'data: {' + typed, typed + b"}\n", typed + b"}\r"]
    return tuple(out)


# a failed response: its own event, or an error event (the answer failed under a 200)
FAILED_EVENTS = _event_markers("response.failed", "error")
# a whole response object's status when it did not answer (vLLM answers these with 200)
FAILED_STATUSES = ("failed", "cancelled")
# a whole stream's last event (vLLM, SGLang and OpenAI send no [DONE] after it)
LAST_EVENTS = (*_event_markers("response.completed", "response.incomplete"),
               *FAILED_EVENTS)
# the longest marker: a window that holds this many bytes before a new chunk finds one
# split across reads
MARKER_BYTES = max(len(marker) for marker in LAST_EVENTS)
# a response's id: the first id in its first bytes, the body's own or the response's in
# response.created (vLLM names a response after the body's request_id when the client
# gives one, so any name is read)
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"\\\s]{1,256})"')
_ID_LOOK_BYTES = 4096


def responses_fields(body: Any) -> RequestFields:
    """The checked fields of a Responses request, its chat in ``messages`` and ``tools``;
    BadRequest naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    model = model_field(body)
    stream = bool(optional(body, "stream", bool, False))
    limit = positive_int(body, "max_output_tokens")
    salt = check_cache_salt(body.get("cache_salt"))
    chat = responses_chat(body)
    # nothing the chat key can read (a continuation of items alone): an empty user turn
    messages = [*chat.instructions, *chat.turns] or [{"role": "user", "content": ""}]
    return RequestFields(body, model, stream, limit, salt, messages=messages,
                         tools=chat.tools)


def response_id(first_bytes: bytes) -> str | None:
    """The id of the response whose body (or stream) starts with ``first_bytes``; None
    where there is none, or it is not UTF-8 (no client could name it again: a JSON string
    is UTF-8)."""
    found = _RESPONSE_ID.search(first_bytes, 0, _ID_LOOK_BYTES)
    if found is None:
        return None
    try:
        return found.group(1).decode()
    except UnicodeDecodeError:
        return None
