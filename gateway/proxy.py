"""Forward a request to the ranked replicas and relay the answer, never passing a cut-off
answer for a whole one.

``Proxy.open`` tries the decision's replicas in order until one answers: a connect error
ejects the replica and moves on; a 5xx, a first-byte timeout, a body cut before anything
reached the client, or a stream that ends before its first event moves on too, counted
against the replica (``Fleet.request_failed`` ejects it after several in a row), and so does
a 3xx: a redirect is never followed nor relayed (its ``Location`` would send a client that
follows it, the openai client among them, on to wherever the replica pointed, the prompt
with it); a 4xx (and a 501: not implemented there) is the client's problem and is relayed
as it is, except a replica's refusal of a prompt longer than its context
(``_context_limit``) while a replica still to try serves the model with a longer one: the
request goes on there, within the same tries (``_ContextTooLong``). A 5xx is counted
against its replica only once another replica answered the request: when a second one
answers it with a 5xx too, the request is what fails (input that breaks the engine), no
further replica is tried, neither is counted, and the client gets the replica's error
message. Every try shares the request's one first-byte deadline: a later try gets what is
left of it (none under ``_LEAST_TRY_S``), and one that the deadline, not its own wait, cut
short is not counted against its replica. A try's own wait (``gateway.first_byte``) is
extended while its replica shows progress (it gave another request its first byte, or
finished one, since the wait began or was last extended): a busy replica is slow, not hung.

A non-streamed answer is read whole (up to ``buffer_bytes``) before the client sees a byte,
so a replica dying mid-body is retried like any other failure, and so is an answer cut
under a clean length or chunked end (``_read_held``, which parses it once: its usage and
status are read from that value): an answer of an endpoint the gateway knows (completions,
chat, responses, generate: one JSON value) whose JSON or compressed stream ends short, and
a completion's or chat's whose choice has a null finish reason. That last is the replica's
answer cut, as in a stream, and gets what a cut answer gets, never a 200: the client
cannot tell it from a whole one (the openai client returns it as whole), where a stream of
it ends with an error event; held before the client saw a byte, it goes to the next
replica, and from the last a 502 names the replica. So does a known endpoint's success that
carries nothing: no body (a 204), or a completion's or chat's that is an error object
without choices, or whose ``choices`` is empty where the request asked at least one
(``_Held.empty``; a stream that ends with no choice at all ends with an error event in
place of its [DONE]). A pass-through answer is left to its
transport. A longer one is relayed with the replica's ``content-length``, its bytes
searched for an abort as a stream's are (a whole answer that is an error object under a
200 is failed too), and one that ends with its connection, or a known endpoint's success
whatever its framing (an error's body is the replica's words, whatever they are), is whole
only when its JSON ended; a known endpoint's success is cut, too, where a completion's or
chat's choice came with a null finish reason, or an encoded one's compressed stream ends
short (``_LongAnswer``, which follows them as the bytes pass): the client's body is then
left unfinished, as a cut one's is. ``UpstreamStream`` then yields the rest as it arrives,
enforcing the idle timeout between chunks, and settles the accounting exactly once
however the stream ends. When the replica breaks off after the client got
bytes, the end says so: a stream ends with an OpenAI error event and no ``[DONE]`` (a
Responses stream with that API's own, ``event: error``, numbered one past the last event
the client got where the replica numbers them: ``responses_error_event``); a body ends
short of its ``content-length`` with the connection dropped (``cut`` names the cause).
A stream is relayed in whole events (a piece of one waits for its end), so the error
event follows whole events. A stream whose ``[DONE]`` reached the client is whole
however its body ends after that (the client hanging up at once, as the openai client
does, or the replica never closing it); an OpenAI completion stream whose body ends
without ``[DONE]`` is cut, and so is one whose body ends on a ``[DONE]`` (or a Responses
stream's last event) without the blank line that ends it (a blank line in a later read
still counts): a client dispatches no event before its blank line (``_ended``), and that
piece of an event is not sent, so the error event does not run into it (``_ends_cut``).
One whose ``[DONE]`` came while a choice it began had no finish reason was cut too
(vLLM and SGLang end every choice with one before ``[DONE]``): the client gets an error
event in place of that ``[DONE]``, and the answer is counted failed. A stream of several
choices has each one's finish noted as its events are relayed (``_Choices``); one of a
single choice notes as its bytes are read whether a finish reason came, and one that is
not null (``_OneFinish``), however long its last events, and passes where its writer
tells none. A stream whose last event came
right after a piece of an event (its data no JSON: a write cut short, then the end) is
relayed as it came, and counted failed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

import orjson

from gateway import generate_request, responses_request
from gateway.config import HealthConfig, TimeoutConfig
from gateway.data_parallel import group_of
from gateway.errors import FleetBusy, UpstreamError, UpstreamTimeout
from gateway.first_byte import FirstByteDeadline
from gateway.fleet import Fleet, Pending, ReplicaState
from gateway.fleet_events import FleetEvent, HealthChanged
from gateway.idle_watch import IdleWatch
from gateway.metrics import GatewayMetrics
from gateway.upstream_http import (
    EncodedEnd,
    UpstreamBroken,
    UpstreamClient,
    UpstreamFailure,
    UpstreamResponse,
    UpstreamUnreachable,
    encoded_cut,
)
from kvwire.openai_schema import BadRequest, NotFound, ServiceUnavailable
from kvwire.request_edge import ClientWatch

log = logging.getLogger("kvgate.proxy")

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length", "proxy-connection",
    # the gateway sends the whole body at once: a replica's 100 Continue would be noise
    "expect",
})
_USAGE_CAPTURE_LIMIT = 1 << 20  # bytes of a non-streamed body kept to read its usage
_SHUTDOWN = "shutdown"  # the cut of an answer the gateway's shutdown ended
# the cut of a stream whose body ended cleanly, by its framing, before its last event
CUT_SHORT = "cut_short"
_SSE_TAIL = 8192  # bytes of a stream kept: its last event carries the usage
_IDENTITY = frozenset(("identity", ""))  # content-encodings whose bytes are the body
_UNPARSED = object()  # a held body not parsed yet
_NO_JSON = object()  # a held body that is no JSON
_DONE_EVENT = b"data: [DONE]\n\n"  # an OpenAI stream's last event
_DONE_DATA = _DONE_EVENT.rstrip()
_DONE_WINDOW = len(_DONE_DATA) + 4  # [DONE] and its line ends (\r\n\r\n at most)
_DONE_MARK = b"[DONE]"  # the data of the last event, however its lines are written
_DONE_LINES = (b"data:[DONE]", _DONE_DATA)  # its data line, with or without the space
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark
_DONE_LOOK_BACK = 512  # bytes of a stream's tail searched for a [DONE] written otherwise
# what ``_content_events`` counts in a stream: a data line (after a line end: \n, \r\n,
# or \r, searched only where a \r is), less a chat choice's opening role-only chunk, as
# vLLM, SGLang, OpenAI and kvgate's engine write them; and the usage-only event (choices
# empty), the last before [DONE], which ``content_chunks`` takes off from the tail
_DATA_LINE = b"\ndata:"
_CR_DATA_LINE = b"\rdata:"
_ROLE_ONLY = b'"delta":{"role":"assistant","content":""'
_USAGE_ONLY = b'"choices":[]'
_CONTENT_SIGNS = ((_DATA_LINE, 1), (_CR_DATA_LINE, 1), (_ROLE_ONLY, -1))
_CONTENT_EDGE = len(_ROLE_ONLY) - 1  # bytes each side of a read's start searched for them
_LINE_ENDS = (b"\n", b"\r")
_COMMENT_STARTS = (b":", b"\n", b"\r")  # a line a read starting a line may begin with
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")  # a server-sent event ends at a blank line
_HOLD_BYTES = 1 << 20  # a stream's unfinished event held back at most this long
# the failures of a try that the request itself may cause (input that crashes the engine,
# or its connection): counted against the replica only once another replica answered the
# request, and after two replicas failed on it, not tried further
REQUEST_MAY_CAUSE = frozenset(("5xx", "broken"))
_ERROR_BODY_LIMIT = 4096  # bytes of a replica's 5xx body read (for the log)
_LEAST_TRY_S = 0.1  # a later try needs this much of the first-byte deadline left
_CHECK_AHEAD_S = 0.05  # a try's wait is checked for progress this long before it ends
_ERROR_MESSAGE_CHARS = 300  # of a replica's 5xx message, told to the client
# how vLLM and SGLang tell an error inside a stream they answered 200: an event whose data
# is an OpenAI error (``{"error": {"message", "type", "code"}}``), then [DONE]
_ERROR_EVENTS = (b'data: {"error"', b'data:{"error"')
# a stream the replica aborted before its end, though it ends with [DONE]: vLLM's
# finish_reason (pydantic's JSON, or another writer's with spaces), SGLang /generate's
# meta_info.finish_reason (orjson's, or json's); JSON strings escape their quotes, so no
# content holds these bytes
_ABORTS = (b'"finish_reason":"abort"', b'"finish_reason": "abort"',
           b'"finish_reason":{"type":"abort"', b'"finish_reason": {"type": "abort"')
_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')
# a completion's or chat's stream event's first choice's index: its first key, as vLLM,
# SGLang and OpenAI write it (a tool call's index is no choice's); and a choice's finish
# reason. JSON strings escape their quotes: no content holds these bytes
_CHOICE_INDEX = re.compile(rb'"choices":\s*\[\s*\{\s*"index":\s*(\d{1,9})')
_FINISH_KEY = b'"finish_reason"'
_FINISH_TOLD = re.compile(rb'"finish_reason"\s*:\s*[^n\s]')  # one that is not null
_A_CHOICE = re.compile(rb'"choices"\s*:\s*\[\s*\{')  # an event's choices, not empty
# a Responses stream event's number
_SEQUENCE_KEY = b'"sequence_number"'
_SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(\d{1,18})')
_MAX_CHOICES = 1024  # choice indices a stream's judgement keeps (past them: not judged)
_JSON = json.JSONDecoder()  # raw_decode: a value that more bytes follow
_STATUS_CODE = re.compile(rb'"status_code":\s*(\d{3})\b')
# a 400 refusing a prompt longer than the replica's context, and that context's tokens:
# vLLM's and the engine's "This model's maximum context length is N tokens" (OpenAI's
# words), the engine's and SGLang's "maximum context length of N" and "context length
# (N tokens)", vLLM V1's "longer than the maximum model length of N"
_CONTEXT_LIMIT = re.compile(r"maximum context length (?:is|of) (\d{1,9})|maximum model "
                            r"length of (\d{1,9})|context length \((\d{1,9}) tokens\)")
# llama.cpp's server's refusal of a prompt longer than its context (its ``n_ctx`` beside)
_LLAMA_CPP_CONTEXT = "exceed_context_size_error"
# a whole answer that is an error object (OpenAI's and vLLM's, or older vLLM's and SGLang's)
_ERROR_OBJECT = re.compile(rb'\s*\{\s*(?:"error"\s*:|"object"\s*:\s*"error")')
# bytes of the tail searched with a chunk, for a marker split across reads
_ERROR_LOOK_BACK = max(len(marker) for marker in (*_ERROR_EVENTS, *_ABORTS,
                                                   *responses_request.FAILED_EVENTS)) - 1


class AnswerSigns(NamedTuple):
    """How the answers of one upstream path tell that they ended whole or failed."""

    # a stream is whole only once its last event came: [DONE], or one of ``last_events``
    # (an OpenAI completion's or chat's, SGLang's /generate, a Responses stream)
    last_event: bool = False
    meta_counts: bool = False  # SGLang's /generate: usage in each event's meta_info
    # events that tell a failed answer beyond the error events every stream may have
    failed_events: tuple[bytes, ...] = ()
    # a stream's last events other than [DONE]: no content holds them
    last_events: tuple[bytes, ...] = ()
    # a whole (non-streamed) answer's top-level ``status`` values that tell it failed
    failed_statuses: tuple[str, ...] = ()
    # an OpenAI completion's or chat's stream of several choices: each of them ends with a
    # finish reason (``_Choices``)
    choices: bool = False
    # an OpenAI completion's or chat's stream of one choice: a finish reason that is not
    # null comes before its [DONE] (``_OneFinish``)
    last_finish: bool = False
    # an OpenAI completion's or chat's answer to a request that asks at least one choice:
    # one with no choice at all (whole: ``choices`` empty; a stream: no event with one)
    # carries nothing
    some_choice: bool = False
    # a non-streamed answer is one JSON value: held whole, one that does not parse, or whose
    # compressed stream ends short, was cut (``_read_held``)
    whole_json: bool = False
    # a Responses stream: each event named (an ``event:`` line, its data's ``type``), the
    # error event the gateway ends a cut one with too (``responses_error_event``)
    named_events: bool = False


_PLAIN = AnswerSigns()  # the pass-through endpoints' answers: their transport tells
_SIGNS = {"/v1/completions": AnswerSigns(True, choices=True, whole_json=True),
          "/v1/chat/completions": AnswerSigns(True, choices=True, whole_json=True),
          generate_request.PATH: AnswerSigns(True, meta_counts=True, whole_json=True),
          responses_request.PATH: AnswerSigns(True, False, responses_request.FAILED_EVENTS,
                                              responses_request.LAST_EVENTS,
                                              responses_request.FAILED_STATUSES,
                                              whole_json=True, named_events=True)}
# ... of a request that asks one choice, and of one that asks several (``answer_signs``),
# made once
_ONE_CHOICE_SIGNS = {path: signs._replace(choices=False, last_finish=True, some_choice=True)
                     for path, signs in _SIGNS.items() if signs.choices}
_SEVERAL_ASKED_SIGNS = {path: signs._replace(some_choice=True)
                        for path, signs in _SIGNS.items() if signs.choices}


def answer_signs(path: str, several_choices: bool = True,
                 asks_choices: bool = False) -> AnswerSigns:
    """How the answers to ``path`` tell that they ended whole or failed. A completion's or
    chat's stream is judged choice by choice where the request asks several choices
    (``several_choices``: its prompts times its ``n`` over one), else by whether a finish
    reason other than null came anywhere in its bytes before its [DONE] (``_OneFinish``,
    where its writer tells finish reasons): a stream of one choice never has one
    unfinished while another finished, and noting its choices would cost each of its
    events a parse. An answer with no choice at all carries nothing where the request
    asks one, or several (``asks_choices``: an ``n`` that is a positive integer; one the
    replica may read as none, 0 or no integer, is not judged so)."""
    if not several_choices:
        one = _ONE_CHOICE_SIGNS.get(path)
        if one is not None:
            return one
    elif asks_choices:
        several = _SEVERAL_ASKED_SIGNS.get(path)
        if several is not None:
            return several
    return _SIGNS.get(path, _PLAIN)


# what the gateway writes itself: its server's date and name, and CORS, which only the
# gateway's ``cors`` config answers (a replica's own, such as vLLM's allow-any-origin
# default, opened a gateway configured with no origins to every web page)
_SERVER_OWN = _HOP_BY_HOP | {
    "date", "server", "access-control-allow-origin", "access-control-allow-credentials",
    "access-control-allow-methods", "access-control-allow-headers",
    "access-control-expose-headers", "access-control-max-age"}


def forward_headers(headers: Mapping[str, str], skip: frozenset[str] = _HOP_BY_HOP
                    ) -> dict[str, str]:
    """``headers`` less the hop-by-hop ones: ``skip`` and any named in ``Connection``.
    A name that comes more than once (``items()`` of Starlette's ``Headers`` gives each
    line) keeps all its values, joined by ", " (RFC 9110's combined field value; a
    ``Cookie``'s by "; ", as RFC 6265 joins them), and every ``Connection`` line counts."""
    out: dict[str, str] = {}
    named: list[str] = []  # the Connection lines' values
    for k, v in headers.items():
        low = k.lower()
        if low == "connection":
            named.append(v)
        if low not in skip:
            had = out.get(k)
            out[k] = v if had is None else f"{had}{'; ' if low == 'cookie' else ', '}{v}"
    for name in {h.strip().lower() for v in named for h in v.split(",")}:
        out.pop(name, None)  # (the names are lower case, as ASGI and the client give them)
    return out


def _upstream_error(message: str, code: str) -> dict[str, object]:
    return {"message": message, "type": "upstream_error", "param": None, "code": code}


def sse_error_event(message: str, code: str) -> bytes:
    """An OpenAI-shaped error as a server-sent event (what a cut completion's or chat's
    stream ends with)."""
    return b"data: " + orjson.dumps({"error": _upstream_error(message, code)}) + b"\n\n"


def responses_error_event(message: str, code: str, sequence_number: int | None) -> bytes:
    """The error event of OpenAI's Responses streams (what a cut one ends with): named
    ``error``, its data's ``type`` too, with ``code``, ``message``, ``param`` and
    ``sequence_number`` at its top (left out where it is not known), as a client typed
    on those events reads it; and the error object under ``error`` as well, last: the
    openai Python client raises on an event whose data holds one, where it hands
    OpenAI's bare error event on as one more event, and the stream ends quietly, its
    answer cut."""
    body: dict[str, object] = {"type": "error", "code": code, "message": message,
                               "param": None}
    if sequence_number is not None:
        body["sequence_number"] = sequence_number
    body["error"] = _upstream_error(message, code)
    return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"


@dataclass(slots=True)
class Attempted:
    replica: str
    cause: str
    status: int | None = None  # the replica's error status, when it answered one


class _Waiting:
    """A request waiting for a replica's first byte, abandoned if the replica is ejected
    (``why``: ``ejected``, it goes on to the next replica) or the gateway's shutdown time
    is up (``shutdown``: the client gets a 503)."""

    __slots__ = ("task", "why")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.why: str | None = None

    def abandon(self, why: str) -> None:
        if self.task is not None and self.why is None:
            self.why = why
            self.task.cancel()


class _Retryable(Exception):
    """A replica failed before the client saw anything: try the next one. ``unsent``: the
    replica did not take the prompt (it shed load, was not reached, did not store what the
    request continues, refused the gateway's key for it, or answered a 5xx, a 3xx or a
    status under 100 before any byte),
    and the policy takes the try back. A timeout (or the deadline, or an ejection while
    waiting), a connection broken once sent, and a stream opened with an error event (the
    replica took the prompt, and failed on it) are not: the replica may have queued or
    computed the prompt (one that crashed shows as a restart later)."""

    def __init__(self, cause: str, message: str, code: str = "upstream_error",
                 retry_after_s: float | None = None, status: int | None = None,
                 unsent: bool = False) -> None:
        super().__init__(message)
        self.cause = cause
        self.code = code
        self.retry_after_s = retry_after_s  # a busy replica's Retry-After
        self.status = status  # the replica's, when it answered an error
        self.unsent = unsent


class _ContextTooLong(_Retryable):
    """A replica's 400 refusing the prompt as longer than its context, while replicas still
    to try serve the model with a longer one (``longer``, in their order): the request
    goes on to them alone, and nothing is held against the replica. ``refusal``: its
    error, for the client should none of them be tried after all."""

    def __init__(self, replica: str, limit: int, refusal: BadRequest,
                 longer: list[str]) -> None:
        super().__init__("context_length", f"replica {replica!r} refused the prompt as "
                         f"longer than its context of {limit} tokens",
                         "context_length_exceeded", status=400, unsent=True)
        self.refusal = refusal
        self.longer = longer


_BUSY = frozenset({429, 503})  # a replica shedding load: not broken, and not the request's


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (its HTTP-date form is not read), within [0, 1 h]."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return None if seconds is None or not 0 <= seconds <= 3600 else seconds


class _EndedShort(UpstreamFailure):
    """An event stream's body ended cleanly (its chunked or ``content-length`` framing
    whole) before its last event: the replica ended it short, the connection unbroken."""

    cause = "ended its stream before its last event"


def _told(stream: UpstreamStream, ok: bool) -> None:
    """A stream's ``on_done`` once it was called."""


class UpstreamStream:
    """An open upstream response whose first bytes have arrived (a non-streamed answer's
    first ``buffer_bytes``, or all of it)."""

    def __init__(self, replica: str, response: UpstreamResponse, first_chunk: bytes,
                 pending: Pending, idle_s: float, fleet: Fleet,
                 on_done: Callable[[UpstreamStream, bool], None], first_byte_s: float = 0.0,
                 on_cut: Callable[[UpstreamStream], None] | None = None,
                 signs: AnswerSigns = _PLAIN,
                 relaying: set[UpstreamStream] | None = None,
                 opening_failure: int | None = None, answer: Any = _UNPARSED,
                 body_waited_s: float = 0.0) -> None:
        """``opening_failure``: the status of the failure a stream's first event told, its
        caller's judgement (``_stream_opening_failure``): those bytes are not searched
        again. ``answer``: a whole body, ``first_chunk``, parsed already (``_read_held``:
        ``_NO_JSON`` where it is none), not parsed again. ``body_waited_s``: how long a
        body's first bytes, ``first_chunk``, took to come after its first byte (the rest
        comes within ``idle_s`` less that, ``relay``)."""
        self.replica = replica
        self.relaying = relaying  # the proxy's streams being relayed (``stop``)
        self.client: ClientWatch | None = None  # watches the client during the relay
        self.left = False  # the client left before its answer was whole
        # the relay's idle timeout (``relay``), which also bounds each send to the client
        self.idle: IdleWatch | None = None
        self._stopping: str | None = None  # why the gateway ends the relay (``stop``)
        self._ejected = False  # cut for its replica's ejection (``replica_ejected``)
        self._reading = False  # waiting in ``readany`` (the wait began at ``idle.since``)
        self.signs = signs
        self.first_byte_s = first_byte_s  # from sending to the first body byte
        self._opened = time.perf_counter() - first_byte_s
        self.first_byte_at = self._opened + first_byte_s  # its perf_counter
        self.duration_s: float | None = None  # from sending to the last byte, once closed
        self.response = response
        self.status = response.status
        events = "text/event-stream" in response.headers.get("content-type", "")
        # an encoded stream (gzip from a compressing hop) has no events to read: it is
        # relayed as a body, bytes unchanged, a cut shown by the dropped connection
        self.stream = events \
            and response.headers.get("content-encoding", "identity").lower() in _IDENTITY
        # an answer that is no event stream comes whole within ``idle_s`` of its first
        # byte (``relay``); an event stream, encoded or not, within ``idle_s`` of each read
        self._whole_within_idle = not events
        self.headers = forward_headers(response.headers, _SERVER_OWN)
        length = response.headers.get("content-length")
        if length is not None and not self.stream:
            self.headers["content-length"] = length  # a short body then shows as cut
        self.first_chunk = first_chunk
        self.pending = pending
        self.idle_s = idle_s
        self._body_waited_s = body_waited_s
        self.fleet = fleet
        self.on_done = on_done
        self.on_cut = on_cut
        self.cut: str | None = None  # why the replica broke off, once it has
        # what usage() reads: a stream's last bytes, or a body's chunks (up to a limit,
        # ``_body_held`` while they are all of it); a body's last bytes tell how it ends
        self._tail = first_chunk[-_SSE_TAIL:]
        # SGLang's /generate: the head of the last event's meta_info, whose counts an event
        # longer than the tail (its whole text and log probabilities so far) leaves out
        self._meta: bytes | None = None
        if signs.meta_counts and self.stream:
            self._meta = b""
            self._note_meta(b"", first_chunk)
        self._body = [] if self.stream else [first_chunk]
        self._body_bytes = len(first_chunk)
        self._body_held = True
        self._answer: Any = answer  # the held body parsed (``_parsed_body``)
        self._events: int | None = None  # SSE events relayed, once count_events() asks
        self.first_sent_at: float | None = None  # perf_counter when the client got a chunk
        self._closed = False
        self._delivered = False  # a stream's [DONE] reached the client
        self._held: list[bytes] = []  # a stream's last event until it ends (_whole_events)
        # a completion's or chat's stream of several choices: its choices, noted as they are
        # relayed
        self._choices = _Choices() if self.stream and signs.choices else None
        # a completion's or chat's stream whose [DONE] is still to be judged (``_judged``)
        self._judging = self.stream and (signs.choices or signs.last_finish)
        # ... of one choice: whether it finished, noted as its bytes are read
        self._finish = _OneFinish() if self.stream and signs.last_finish else None
        self._held_bytes = 0
        self._usage: tuple[Usage | None] | None = None  # read once, at the end (usage())
        # a stream's last JSON event's data and value, parsed at its end (``_stream_end``)
        self._last_json: tuple[bytes, Any] | None = None
        # (an event line is found after a line end: the body's start is one)
        start = b"\n" + first_chunk if self.stream and signs.last_events else first_chunk
        # one of ``signs.last_events`` came: the stream is whole once it ends there
        self._last_seen = self._has_last_event(start)
        # the status an error event in the stream gave (its code), or the replica's abort
        # of the answer (a whole one's anywhere in its body), or a whole answer that is an
        # error object under a success status, once one came: the answer failed, however
        # its body ends
        self.error_status = opening_failure if opening_failure is not None \
            else self._error_in(start)
        if self.error_status is None and not self.stream and self.status < 400:
            self.error_status = _error_object(first_chunk)
        if self._finish is not None:
            self._finish.note(first_chunk)
        # a known answer's success relayed past ``buffer_bytes``: what tells it cut under
        # a clean end, followed as its bytes pass (``_LongAnswer``)
        self._long = _LongAnswer.of(response, signs) if signs.whole_json \
            and not self.stream and self.status < 400 and not response.is_eof() else None
        if self._long is not None:
            self._long.note(first_chunk, first_chunk)

    @property
    def complete(self) -> bool:
        """True when the first chunk was the whole body (a non-streamed answer)."""
        return self.response.is_eof() and not self.stream

    def whole_body(self) -> bytes:
        """The body of a ``complete`` response; settles the accounting."""
        assert self.complete
        self.first_sent_at = time.perf_counter()
        self.close(True)
        return self.first_chunk

    def client_gone(self) -> None:
        """The client left (or stopped reading): recorded so unless it had the stream's
        last event."""
        self.left = not self._delivered

    def replica_ejected(self, grace_s: float, still_out: Callable[[], bool]) -> None:
        """Its replica was ejected (health checks, failures): while it stays out
        (``still_out``), a wait for its next bytes that lasts ``grace_s`` (one that already
        has: now) ends the relay as cut (``ejected``), not only one that lasts the idle
        timeout. A stream still flowing goes on (its bytes say the replica is alive), and
        so does a wait for the client to take what was sent: only the replica's silence
        counts, and only until it is readmitted. A check every ``grace_s`` at most."""
        loop = asyncio.get_running_loop()

        def check() -> None:
            watch = self.idle
            if self._closed or watch is None or not still_out():
                return
            since = watch.since if self._reading else None
            waited = 0.0 if since is None else loop.time() - since
            if since is not None and waited >= grace_s and grace_s < watch.idle_s:
                self._ejected = True
                watch.fire()  # the relay is waiting in ``readany``: cancelled there
                return
            loop.call_later(grace_s - waited, check)

        check()

    def stop(self, cause: str) -> None:
        """End the relay as cut (``cause``): the gateway is going away. The client's
        answer ends with an error event (a stream) or a dropped connection."""
        self._stopping = cause
        self.response.close()

    async def relay(self, watch: IdleWatch) -> AsyncGenerator[bytes, None]:
        """The answer's bytes as they come, each read from the replica waiting ``idle_s``
        at most (``watch``: the caller's, which bounds its sends to the client too, from
        the head to the end of the body, and stops it after the last). The replica's quiet
        time adds up over reads where it showed no progress: the reads of a body that is
        no event stream all together wait ``idle_s`` at most from its first byte (time
        spent sending to the client not counted), and a stream's reads that brought only
        comment lines (keep-alives) add to the wait for its next event. An encoded stream
        (no events read in its bytes) shows progress with each read."""
        ok = False
        loop = asyncio.get_running_loop()
        # counted in the next wait
        quiet_s = self._body_waited_s if self._whole_within_idle else 0.0
        self.idle = watch
        if self.relaying is not None:
            self.relaying.add(self)
        try:
            self.first_sent_at = time.perf_counter()
            response = self.response
            first = self.first_chunk
            if self.stream and (not response.is_eof() or self._ends_cut()):
                first = self._whole_events(first)
            if first:
                if self._choices is not None:
                    self._choices.note(first)
                yield self._judged(first) if self._judging else first
                self._delivered = self.stream and not self._held and self._ended()
            while True:
                watch.waiting(quiet_s)  # the wait began that much earlier
                self._reading = True
                chunk = await response.readany()
                self._reading = False
                if self._whole_within_idle or (
                        self.stream and chunk and _comments_only(self._tail, chunk)):
                    quiet_s = loop.time() - (watch.since or 0.0)
                else:
                    quiet_s = 0.0
                watch.got()
                if self._stopping is not None:
                    raise UpstreamBroken("the gateway ended the relay")
                if not chunk:
                    if self._ends_cut():
                        if response.until_close:  # (a replica that died closes it too)
                            raise UpstreamBroken("the stream ended before its last event")
                        raise _EndedShort("ended its stream before its last event")
                    if self._json_cut():
                        raise UpstreamBroken("the body ended before its JSON did")
                    if self._long is not None and self._long.cut() is not None:
                        raise UpstreamBroken(f"the body ended cut ({self._long.cut()})")
                    if self._held:  # the body ended whole: what was held is its end
                        held = self._take_held()
                        if self._choices is not None:
                            self._choices.note(held)
                        yield self._judged(held) if self._judging else held
                    break
                if self.stream:
                    if self._meta is not None:
                        self._note_meta(self._tail, chunk)
                    if self.error_status is None:  # (an event may start in the tail)
                        window = self._tail[-_ERROR_LOOK_BACK:] + chunk
                        self.error_status = self._error_in(window)
                        finish = self._finish  # (once an error came, it is not asked)
                        if finish is not None and not finish.told:
                            finish.note(window)
                    if not self._last_seen and self.signs.last_events:
                        self._last_seen = self._has_last_event(
                            self._tail[-responses_request.MARKER_BYTES:] + chunk)
                    if self._events is not None:  # (an event may start in the tail)
                        self._events += _content_events(self._tail, chunk)
                    self._tail = (self._tail + chunk)[-_SSE_TAIL:]  # usage is in the tail
                    if not response.is_eof() or self._ends_cut():
                        chunk = self._whole_events(chunk)
                        if not chunk:
                            continue
                    elif self._held:  # the body's end: what was held goes with it
                        chunk = self._take_held() + chunk
                    if self._choices is not None:
                        self._choices.note(chunk)
                    if self._judging:
                        chunk = self._judged(chunk)
                else:
                    # (a marker, or a finish reason's key, may start in the tail)
                    window = self._tail[-_ERROR_LOOK_BACK:] + chunk
                    if self.error_status is None:  # an abort told past the first bytes
                        self.error_status = _error_event(window)
                    if self._long is not None:
                        self._long.note(chunk, window)
                    self._tail = (self._tail + chunk)[-_SSE_TAIL:]
                    if self._body_bytes < _USAGE_CAPTURE_LIMIT:
                        self._body.append(chunk)
                        self._body_bytes += len(chunk)
                    else:
                        self._body_held = False
                yield chunk
                # the client has the stream's last event (none of it held back): a client
                # that hangs up now, before the replica's end of body arrives, got the
                # whole answer
                self._delivered = self.stream and not self._held and self._ended()
            ok = True
        except asyncio.CancelledError:
            if not watch.fired:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            watch.absorbed()  # what is left to send to the client is watched too
            if not self._delivered:  # after [DONE] only the end of body was missing
                self._broke_off("ejected" if self._ejected else "idle_timeout",
                                "was ejected, then sent nothing for a health check "
                                "interval" if self._ejected
                                else f"did not send its body whole within {self.idle_s} s"
                                if self._whole_within_idle
                                else f"sent nothing but comments for over {self.idle_s} s"
                                if quiet_s else f"sent nothing for over {self.idle_s} s")
        except UpstreamFailure as exc:
            if self._stopping is not None:
                self._broke_off(self._stopping, "was cut off by the gateway's shutdown")
            elif not self._delivered:  # after [DONE] only the end of body was missing
                if isinstance(exc, _EndedShort):
                    self._broke_off(CUT_SHORT, str(exc))
                else:
                    self._broke_off("broken",
                                    f"broke the connection ({exc.__class__.__name__})")
        finally:
            # the client left, mid-read or mid-send (then the relay is closed here)
            if not ok and self.client is not None and self.client.fired:
                self.client_gone()
            self.close(ok)
        if self.cut == _SHUTDOWN and self.stream:
            yield self._cut_event("the gateway is shutting down: the answer is incomplete",
                                  "gateway_shutdown")
        elif self.cut is not None and self.stream:
            # (one ended short is broken to the client, as one whose connection broke)
            yield self._cut_event(f"replica {self.replica!r} stopped mid-answer: the answer "
                                  "is incomplete", "upstream_broken" if self.cut == CUT_SHORT
                                  else f"upstream_{self.cut}")

    def _cut_event(self, message: str, code: str) -> bytes:
        """The error event a cut stream ends with: a Responses stream's own
        (``responses_error_event``), numbered one past the last event the client got
        where that told its number; else an OpenAI error object's (``sse_error_event``)."""
        if not self.signs.named_events:
            return sse_error_event(message, code)
        return responses_error_event(message, code, self._next_sequence())

    def _next_sequence(self) -> int | None:
        """One past the ``sequence_number`` of the last event the client got, read from
        the stream's last bytes less the piece held back (not sent); None where that event
        has none in them (a writer that numbers no events, or an event that began before
        them). JSON strings escape their quotes: no content holds the key."""
        tail = self._tail
        sent = tail[:max(0, len(tail) - self._held_bytes)]
        at = sent.rfind(_SEQUENCE_KEY)
        if at < 0 or any(mark in sent[at:].rstrip(b"\r\n") for mark in _EVENT_ENDS):
            return None  # none, or not the last event's
        found = _SEQUENCE.match(sent, at)
        return int(found.group(1)) + 1 if found else None

    def _ended(self) -> bool:
        """The stream's last event came, to its blank line: [DONE], or one of
        ``signs.last_events`` (all of it: its type may come before the rest of its data,
        the whole response). A client dispatches no event before its blank line: a
        [DONE] without it told the client nothing."""
        tail = self._tail
        return tail.endswith(_EVENT_ENDS) and (self._last_seen or _ends_done(tail))

    def _ends_cut(self) -> bool:
        """The stream, read to the end of its body, is cut there: an OpenAI stream (or one
        that ends with its connection, which a replica that died also closes) whose last
        event did not come whole (``_ended``). Its last piece of an event is held back
        then (``_whole_events``): the error event it ends with follows whole events, never
        a piece that a client would read as one event with it."""
        return self.stream and (self.response.until_close or self.signs.last_event) \
            and not self._ended()

    def _judged(self, events: bytes) -> bytes:
        """``events``, whole events of a completion's or chat's stream, as the client gets
        them: when they end with its [DONE] (judged once, before they go out) and a choice
        it began came without its finish reason (``_unfinished``), the replica cut the
        answer though [DONE] came: it is failed (502), and the client gets an error event
        in place of the [DONE] event, as a stream cut short ends; so does a stream of one
        choice that ended with no choice at all (``_OneFinish.no_choice``: an answer that
        carries nothing). Costs each chunk a look at its last bytes until then."""
        if not _ends_done(events):
            return events
        self._judging = False
        if self.error_status is not None or self.status >= 400:
            return events
        unfinished = self._unfinished()
        if unfinished is not None:
            what = f"{unfinished} unfinished (no finish reason came)"
            code = "upstream_unfinished"
        elif (self._finish is not None and self._finish.no_choice) or (
                self._choices is not None and self.signs.some_choice
                and self._choices.none()):
            what, code = "no choice at all", "upstream_empty"
        else:
            return events
        self.error_status = 502
        log.warning("replica %s ended a stream with %s: the answer is incomplete",
                    self.replica, what)
        # the [DONE] event: from the end of the event before it, [start, len(events))
        at = max(events.rfind(line) for line in _DONE_LINES)  # (not a comment's)
        start = 0
        for mark in _EVENT_ENDS:
            end = events.rfind(mark, 0, at)
            if end >= 0:
                start = max(start, end + len(mark))
        return events[:start] + sse_error_event(
            f"replica {self.replica!r} ended the answer with {what}: the answer is "
            "incomplete", code)

    def _unfinished(self) -> str | None:
        """Which choice of the stream came without its finish reason, once its [DONE]
        came: those of several that ``_Choices`` noted unfinished, or the one choice of a
        stream that told finish reasons, none of them other than null (``_OneFinish``);
        None when none did, or when that cannot be told."""
        if self._choices is not None:
            unfinished = self._choices.unfinished()
            if not unfinished:
                return None
            return f"choice {', '.join(map(str, unfinished[:8]))} (of " \
                f"{len(self._choices.seen)})"
        if self._finish is not None and self._finish.unfinished:
            return "its choice"
        return None

    def _has_last_event(self, window: bytes) -> bool:
        return any(marker in window for marker in self.signs.last_events)

    def _error_in(self, window: bytes) -> int | None:
        """``_error_event`` of ``window``, else 502 where it holds one of
        ``signs.failed_events``."""
        status = _error_event(window)
        failed = self.signs.failed_events
        if status is None and failed and any(marker in window for marker in failed):
            return 502
        return status

    def _whole_events(self, data: bytes) -> bytes:
        """Of what was held back and ``data``, the bytes up to the end of the last whole
        server-sent event; the rest is held back until its event ends, so that the error
        event a cut stream ends with follows whole events, not a piece of one. Only the
        new bytes are searched (with the held ones' last 3, for a blank line across
        reads); an event held past ``_HOLD_BYTES`` goes out as it comes."""
        held = self._held
        if not held and data.endswith(b"\n\n"):
            return data  # the usual chunk: whole events
        before = held[-1][-3:] if held else b""
        if len(before) < 3 and len(held) > 1:  # held in pieces shorter than that
            before = b"".join(held[-3:])[-3:]
        window = before + data
        end = 0  # after the last blank line, if any, in ``window``
        for blank in _EVENT_ENDS:
            at = window.rfind(blank)
            if at >= 0 and at + len(blank) > end:
                end = at + len(blank)
        cut = max(0, end - len(before))  # ... in ``data``
        if not end:
            held.append(data)
            self._held_bytes += len(data)
            return self._take_held() if self._held_bytes > _HOLD_BYTES else b""
        out = self._take_held() + data[:cut] if held else data[:cut]
        if cut < len(data):
            held.append(data[cut:])
            self._held_bytes = len(data) - cut
        return out

    def _take_held(self) -> bytes:
        out = b"".join(self._held)
        self._held.clear()
        self._held_bytes = 0
        return out

    def read_whole(self) -> bool:
        """The upstream body was read to its end, whole: the chunk just relayed is the
        last (``relay`` yields nothing more). A stream that ends with its connection is
        whole only once its last event came; else the relay goes on to tell it cut."""
        return self.response.is_eof() and not self._ends_cut() and not self._json_cut() \
            and (self._long is None or self._long.cut() is None)

    def _json_cut(self) -> bool:
        """A JSON body (not encoded) ended before its JSON did, where it ended with its
        connection (a replica that died mid-body closed it too) or is an answer the
        gateway knows (``signs.whole_json``: a success's, as ``_read_held`` judges it;
        an error's body is the replica's words, whatever they are), whatever its framing:
        it does not parse (parsed once, when the gateway holds all of it); else its last
        byte ends no object or array."""
        response = self.response
        known = self.signs.whole_json and self.status < 400
        if self.stream or not ((response.until_close or known) and response.is_eof()):
            return False
        if not _json_body(response.headers):
            return False
        if self._body_held:
            return self._parsed_body() is _NO_JSON
        return not self._tail.rstrip().endswith((b"}", b"]"))

    @property
    def outcome(self) -> str:
        """The status a metric or log should record: 502 for an answer the replica cut
        short, 503 for one the gateway's shutdown cut, an error event's code (502 when it
        gives none) for a stream that told an error, 499 for one the client left."""
        if self.cut is not None:
            return "503" if self.cut == _SHUTDOWN else "502"
        if self.error_status is not None:
            # an event split across reads told no code where it was seen: the stream's
            # last bytes hold it whole (vLLM and SGLang end with it and [DONE])
            return str(self.error_status if self.error_status != 502
                       else _error_event(self._tail) or 502)
        return "499" if self.left else str(self.status)

    def _broke_off(self, cause: str, what: str) -> None:
        self.cut = cause
        log.warning("replica %s %s mid-answer: the client's answer ends with an error",
                    self.replica, what)
        if self.on_cut is not None:
            self.on_cut(self)

    def close(self, ok: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self.relaying is not None:
            self.relaying.discard(self)
        self.duration_s = time.perf_counter() - self._opened
        if ok:
            self.response.release()
        else:
            self.response.close()  # drops the connection: the replica sees the cancel
        self.fleet.done(self.pending)
        if self.signs.failed_statuses and not self.stream and self.status < 400 \
                and self.error_status is None and self._body_held:
            self.error_status = _failed_status(self._held_answer(), self.signs)
        if self.stream and self.signs.last_event and (ok or self._delivered) \
                and self.status < 400 and self.error_status is None:
            end = _stream_end(self._tail, len(self._tail) < _SSE_TAIL)
            self._last_json = end.last_json
            if end.after_a_piece:
                # relayed as it came (a client reading it fails on that event), failed here
                self.error_status = 502
                log.warning("replica %s ended a stream right after a piece of an event: "
                            "the answer is incomplete", self.replica)
        whole = (ok or self._delivered) and self.status < 400 and self.error_status is None
        state = self.pending.state
        if whole and state is not None:
            state.made_progress()
            state.answered_whole(self.stream)
        # let go of the callback once called: what it holds may hold this stream (a cycle
        # left to the garbage collector with everything the request made)
        on_done, self.on_done = self.on_done, _told
        on_done(self, whole)

    def _held_answer(self) -> Any:
        """The whole body held, parsed once (None when it is no JSON): the failed-status
        check at close and the usage after it both read it."""
        answer = self._parsed_body()
        return None if answer is _NO_JSON else answer

    def _parsed_body(self) -> Any:
        """The whole body held, parsed once (``_NO_JSON`` when it is none)."""
        if self._answer is _UNPARSED:
            self._answer = _parsed(b"".join(self._body))
        return self._answer

    def usage(self) -> Usage | None:
        """The body's ``usage`` (a stream's last one), if it reports prompt tokens; parsed
        once the answer ended, then kept (the policy, metrics and a trace all ask)."""
        if self._usage is not None:
            return self._usage[0]
        usage = self._read_usage()
        if self.duration_s is not None:
            self._usage = (usage,)
        return usage

    def _note_meta(self, before: bytes, chunk: bytes) -> None:
        """Keep the head of the last ``meta_info`` in ``chunk`` (or across its start and
        the ``before`` it)."""
        at = chunk.rfind(generate_request.META_KEY)
        if at >= 0:
            self._meta = chunk[at:at + generate_request.META_HEAD_BYTES]
            return
        width = len(generate_request.META_KEY) - 1
        edge = before[-width:] + chunk[:width]
        at = edge.find(generate_request.META_KEY)
        if at >= 0:
            start = at - len(edge[:width])  # where the key starts, in before's last bytes
            self._meta = (before[start:] + chunk)[:generate_request.META_HEAD_BYTES]

    def _read_usage(self) -> Usage | None:
        if self.stream:
            usage = _stream_usage(self._tail, self._meta, self._last_json)
        elif self._body_held:
            usage = _answer_usage(self._held_answer())
        else:  # a body past the capture: its last bytes (not a batch's: its counts are
            # all of its answers')
            usage = _tail_usage(self._tail) \
                if self.first_chunk[:64].lstrip()[:1] == b"{" else None
        return usage_counts(usage)

    def count_events(self) -> None:
        """Count the stream's content events from now on (its first chunk included), for
        ``content_chunks`` when the answer will carry no usage."""
        self._events = _content_events(b"\n", self.first_chunk)  # a line starts the body

    def content_chunks(self) -> int | None:
        """The events that carried content, once ``count_events`` counted them: one per
        token for vLLM and kvgate's engine (an event's tokens that a stop string holds
        back go out with a later one). Counted are the events with data (a comment, a
        keep-alive, carries none), less ``[DONE]``, the usage-only event (its choices
        empty) and each choice's opening role-only chunk (a chat stream's). With n > 1
        choices every choice's events count: the sum over the choices, as vLLM's
        ``usage.completion_tokens`` is."""
        if self._events is None:
            return None
        tail = self._tail
        return max(0, self._events - _ends_done(tail) - _usage_only_last(tail))


def _stream_usage(tail: bytes, meta: bytes | None,
                  parsed: tuple[bytes, Any] | None = None) -> Any:
    """The last ``usage`` in a stream's ``tail`` (that of the event holding it), else
    (SGLang's ``/generate``) the last ``meta_info``'s counts, read from the tail and the
    head of that ``meta`` kept; None when neither reads. ``parsed``: an event's data and
    its value, read already (not parsed again when it is the data that holds the usage)."""
    idx = tail.rfind(b'"usage"')
    if idx < 0:
        return None if meta is None else generate_request.stream_counts(tail, meta)
    start = tail.rfind(b"data:", 0, idx)
    end = tail.find(b"\n", idx)
    try:
        line = tail[start + 5 if start >= 0 else 0:end if end >= 0 else None]
        line = line.removeprefix(b" ").rstrip(b"\r")
        data = parsed[1] if parsed is not None and parsed[0] == line else _loads(line)
        if "usage" not in data and isinstance(data.get("response"), dict):
            data = data["response"]  # a Responses stream's last event: the response's
        return data.get("usage") or {}
    except (ValueError, AttributeError):
        # an event that began before the tail (a Responses stream's last holds the whole
        # response, its text too): the value of its last usage key
        return _tail_usage(tail)


def _failed_status(answer: Any, signs: AnswerSigns) -> int | None:
    """502 when a whole answer's top-level ``status`` is one of ``signs.failed_statuses``
    (a Responses answer that failed or was cancelled, sent with 200), else None."""
    status = answer.get("status") if isinstance(answer, dict) else None
    return 502 if status in signs.failed_statuses else None


def _answer_usage(answer: Any) -> Any:
    """A whole (parsed) body's ``usage``, else its ``meta_info``'s counts; None when
    neither."""
    if answer is None:
        return None
    if isinstance(answer, dict) and "usage" in answer:
        return answer["usage"] or {}
    return generate_request.counts_of(answer)


def _tail_usage(tail: bytes) -> Any:
    """A long body's ``usage``, read from its last bytes (``tail``), where OpenAI's and
    vLLM's bodies put it, else the counts of a ``meta_info`` there (SGLang's
    ``/generate``); None when neither reads. JSON strings escape their quotes: ``"usage"``
    then a colon is a key's, not content's; the last one is the body's."""
    ends = [found.end() for found in _USAGE_KEY.finditer(tail)]
    if not ends:
        return generate_request.stream_counts(tail)
    try:
        usage, _ = _JSON.raw_decode(tail[ends[-1]:].decode(errors="replace"))
    except ValueError:
        return None
    return usage or {}


class Usage(NamedTuple):
    """What a replica reported in ``usage``, in its own tokens. ``cached_told``: whether
    it told its cached tokens (vLLM does with ``--enable-prompt-tokens-details``, SGLang
    with ``--enable-cache-report``); where not, ``cached_tokens`` is 0 whatever it held."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int | None
    cached_told: bool = True


def usage_counts(usage: Any) -> Usage | None:
    """The counts of a ``usage`` object (Chat Completions' names or the Responses API's),
    or None where it holds none: missing, or not counts (negative, a bool, more cached
    than sent), or no prompt token (a prompt has one at least: the replica does not count
    them)."""
    try:
        if "prompt_tokens" in usage:
            prompt = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details")
            completion = usage.get("completion_tokens")
        else:  # the Responses API's names
            prompt = usage.get("input_tokens")
            details = usage.get("input_tokens_details")
            completion = usage.get("output_tokens")
        told = isinstance(details, dict) and details.get("cached_tokens") is not None
        cached = details.get("cached_tokens") if told else 0
    except (ValueError, AttributeError, TypeError):
        return None
    if _count(prompt) and prompt > 0 and _count(cached) and cached <= prompt:
        return Usage(prompt, cached, completion if _count(completion) else None, told)
    return None


class Proxy:
    def __init__(self, client: UpstreamClient, fleet: Fleet, timeouts: TimeoutConfig,
                 metrics: GatewayMetrics, max_attempts: int,
                 health: HealthConfig | None = None, forward_client_auth: bool = True
                 ) -> None:
        self.client = client
        self.fleet = fleet
        self.timeouts = timeouts
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.health = health or HealthConfig()
        self.forward_client_auth = forward_client_auth  # False: the key was the gateway's
        self.first_byte = FirstByteDeadline(timeouts)
        self.relaying: set[UpstreamStream] = set()  # answers being relayed now
        self._waiting: dict[str, set[_Waiting]] = {}
        fleet.listen(self._on_fleet_event)

    def stop_relays(self) -> int:
        """The shutdown's time is up: cut every answer still being relayed (each client
        sees its answer end broken, and each is counted so), and end every request still
        waiting for a first byte with a 503 (``gateway_shutdown``) before the server
        cancels it without an answer of ours. Returns how many of each there were."""
        streams = list(self.relaying)
        for stream in streams:
            stream.stop(_SHUTDOWN)
        waiting = [w for held in self._waiting.values() for w in held]
        for w in waiting:
            w.abandon(_SHUTDOWN)
        return len(streams) + len(waiting)

    def close(self) -> None:
        self.fleet.unlisten(self._on_fleet_event)

    def _on_fleet_event(self, event: FleetEvent) -> None:
        """A replica ejected (health checks, failures) takes no more waiting: the requests
        still waiting for its first byte are moved to the next replica, and its answers
        being relayed are cut once they wait a health check interval for their next bytes
        (a hung replica's stream ended only at the idle timeout, a minute by default)."""
        if isinstance(event, HealthChanged) and not event.healthy:
            this = asyncio.current_task()  # the one whose failure ejected it, if any
            for waiting in list(self._waiting.get(event.replica, ())):
                if waiting.task is not this:
                    waiting.abandon("ejected")
            replica = event.replica

            def still_out() -> bool:
                state = self.fleet.get(replica)
                return state is not None and not state.healthy

            for stream in [s for s in self.relaying if s.replica == replica]:
                stream.replica_ejected(self.health.interval_s, still_out)

    async def open(self, ranked: Sequence[str], path: str, body: bytes,
                   headers: Mapping[str, str], work_tokens: Callable[[str], int],
                   on_sent: Callable[[str], None],
                   on_done: Callable[[UpstreamStream, bool], None],
                   stream: bool = False, stored_elsewhere: bool = False,
                   on_unsent: Callable[[str], None] | None = None,
                   several_choices: bool = True,
                   asks_choices: bool = False, query: str = "") -> UpstreamStream:
        """The first replica of ``ranked`` (at most ``max_attempts`` tried) to answer; all
        of them within ``first_byte_s``. ``stored_elsewhere``: a request that only the
        replica storing what it continues can serve (a Responses request's
        ``previous_response_id``): a replica's 404 sends it on to the next, any of
        ``ranked``, and it is a 404 once none had it. ``on_sent(replica)`` is called as
        each try is sent, and ``on_unsent(replica)`` after one that the replica refused
        before taking the prompt (``_Retryable.unsent``). ``several_choices``: False when
        the request asks one choice; ``asks_choices``: it asks at least one, whatever
        ``several_choices`` says (``answer_signs``)."""
        attempts: list[Attempted] = []
        last: _Retryable | None = None
        # a 5xx or a broken answer not counted yet (``REQUEST_MAY_CAUSE``)
        suspect: tuple[str, _Retryable] | None = None
        busy_after: list[float | None] = []  # the Retry-After of each busy replica
        deadline = time.monotonic() + self.timeouts.first_byte_s
        signs = answer_signs(path, several_choices, asks_choices)
        least_wait = self.first_byte.seconds(stream)  # a typical prompt's
        order, at = ranked, 0  # the replicas in the order tried, and the next one's place
        tries = len(order) if stored_elsewhere else self.max_attempts
        while at < len(order) and tries:
            replica, at = order[at], at + 1
            state = self.fleet.get(replica)
            left = deadline - time.monotonic()
            # a later try gets what is left of the request's deadline, unless that is too
            # little to be worth a replica's work (a first try always has its whole wait);
            # a replica passed over (gone or ejected since the decision) uses no try
            if state is None or (not state.healthy and attempts) \
                    or left < min(_LEAST_TRY_S, least_wait / 2):
                continue
            tries -= 1
            if attempts:  # the last try failed, and this one is its retry (counted so
                # whether or not this one answers)
                self.metrics.retried(attempts[-1].replica, attempts[-1].cause)
            on_sent(replica)
            pending = self.fleet.sent(replica, work_tokens(replica))
            per_try = self.first_byte.seconds(stream, pending.tokens, state.watched)
            wait = min(left, per_try)
            sent = state.upstream_headers(headers, self.forward_client_auth)
            # a try left and a replica to try it on: a context-length 400 may go on there
            # (not a continuation: no other replica stores what it continues)
            rest = order[at:] if tries and at < len(order) and not stored_elsewhere else ()
            try:
                # a wait that is the rest of the deadline (a non-streamed answer's) cannot
                # be pushed back: no progress check is armed for it
                opened = await self._attempt(replica, state.config.base_url + path + query,
                                             body,
                                             sent, pending, wait, on_done,
                                             deadline if wait < left else None, signs,
                                             stored_elsewhere, rest, bool(state.credentials))
            except _Retryable as exc:
                if exc.cause == "timeout" and attempts and wait < per_try:
                    # the request's deadline ran out, not the replica's wait: not its fault
                    exc = _Retryable("deadline", f"the request's first-byte deadline "
                                     f"({self.timeouts.first_byte_s:g} s) ran out while "
                                     f"replica {replica!r} had {wait:.3g} s of it",
                                     "upstream_timeout")
                self.fleet.done(pending)
                if on_unsent is not None and exc.unsent:
                    on_unsent(replica)
                attempts.append(Attempted(replica, exc.cause, exc.status))
                last = exc
                if isinstance(exc, _ContextTooLong):  # only a longer context may hold it
                    order = (*order[:at], *exc.longer)
                    continue
                if exc.cause != "not_stored":
                    order = _siblings_last(order, at, state)
                if exc.cause == "busy":  # shedding load: the next replica may not be
                    busy_after.append(exc.retry_after_s)
                    continue
                if exc.cause == "not_stored":  # no fault of the replica's
                    continue
                if exc.cause == "auth":  # its key, not the request: said and counted there
                    state.auth_refused(path, exc.status or 401)
                    continue
                if exc.cause in REQUEST_MAY_CAUSE:
                    if suspect is not None:
                        # a second replica fails on it: the request is the cause
                        suspect = None
                        last = _Retryable(exc.cause, f"{exc} (as did every replica tried: "
                                          "the request itself fails there)",
                                          status=exc.status)
                        break
                    suspect = (replica, exc)
                    continue
                self._count_failure(replica, exc)
                continue
            except BaseException:  # cancelled by a client disconnect
                self.fleet.done(pending)
                raise
            if suspect is not None:  # another replica answered: the 5xx was its replica's
                self._count_failure(*suspect)
            self.fleet.request_ok(replica)
            return opened
        # a 5xx no other replica's answer showed to be its replica's own (the only replica
        # tried, the others unreachable or busy) is not counted: a request that breaks the
        # engine must not eject a model's one replica, where no ejection could help
        if last is None:
            raise UpstreamError("no replica could be tried", code="upstream_error")
        if isinstance(last, _ContextTooLong):  # the longer ones were gone, or out of time
            raise last.refusal
        tried = ", ".join(f"{a.replica!r} ({a.cause})" for a in attempts)
        if all(a.cause == "not_stored" for a in attempts):
            raise NotFound(f"{last} (nor any other replica tried: {tried})",
                           param="previous_response_id", code=last.code)
        # the request itself fails on every replica tried: sending it again will not help
        # (the openai client retries a 5xx unless told not to)
        futile = sum(a.cause in REQUEST_MAY_CAUSE for a in attempts) > 1
        if busy_after and not futile:  # a replica shedding load may take it later
            after = min((s for s in busy_after if s is not None), default=1.0)
            overloaded = "every replica tried is overloaded" \
                if len(busy_after) == len(attempts) else "a replica tried is overloaded"
            raise FleetBusy(f"{overloaded}: {last} (replicas tried: {tried})",
                            max(1, math.ceil(after)))
        error = UpstreamTimeout if last.cause in ("timeout", "deadline", "idle_timeout") \
            else UpstreamError
        failed = error(f"{last} (replicas tried: {tried})", code=last.code,
                       headers={"x-should-retry": "false"} if futile else None)
        statuses = {a.status for a in attempts}
        if len(statuses) == 1 and all(a.cause == "5xx" for a in attempts):
            # every replica answered the same error: the client gets its status, as it
            # would from the replica itself (different ones: the gateway's 502)
            failed.status = attempts[0].status or failed.status
        raise failed

    async def _attempt(self, replica: str, url: str, body: bytes, headers: Mapping[str, str],
                       pending: Pending, wait: float,
                       on_done: Callable[[UpstreamStream, bool], None],
                       deadline: float | None, signs: AnswerSigns,
                       stored_elsewhere: bool = False, rest: Sequence[str] = (),
                       keyed: bool = False) -> UpstreamStream:
        """One replica: its answer's first bytes, or _Retryable. ``wait`` is extended, up
        to ``deadline`` (monotonic; None: never), while the replica shows progress.
        ``rest``: the replicas a refusal of the prompt as too long for the replica's
        context may go on to (``_ContextTooLong``). ``keyed``: ``headers`` carry the
        gateway's own key for the replica, whose 401/403 then refuses that key, not the
        client's: no answer to relay."""
        started = time.perf_counter()
        response: UpstreamResponse | None = None
        whole = _Held(_UNPARSED, None)  # a non-streamed answer held whole, read
        body_waited_s = 0.0  # how long its replica kept the client waiting for the rest
        waiting = _Waiting(asyncio.current_task())
        self._waiting.setdefault(replica, set()).add(waiting)
        patience: _Patience | None = None
        try:
            async with asyncio.timeout(wait) as timer:
                if deadline is not None and pending.state is not None:
                    patience = _Patience(timer, pending.state, wait, deadline)
                response = await self.client.post(url, body, headers)
                if response.resent:
                    self.metrics.retried(replica, "resent")
                if response.status in _BUSY:
                    detail = await response.read(_ERROR_BODY_LIMIT)
                    raise _Retryable("busy", f"replica {replica!r} is overloaded (it answered "
                                     f"{response.status}{_error_message(detail)})",
                                     "fleet_busy",
                                     _retry_after(response.headers.get("retry-after")),
                                     unsent=True)
                if keyed and response.status in (401, 403):
                    detail = await response.read(_ERROR_BODY_LIMIT)
                    raise _Retryable("auth", f"replica {replica!r} refused the gateway's "
                                     "credentials for it (it answered "
                                     f"{response.status}{_error_message(detail)}): the "
                                     "gateway's key for that replica is not one it takes "
                                     "(the client's API key was not sent to it)",
                                     "upstream_auth_failed",
                                     status=response.status, unsent=True)
                if response.status == 404 and stored_elsewhere:
                    detail = await response.read(_ERROR_BODY_LIMIT)
                    raise _Retryable("not_stored", f"replica {replica!r} answered 404"
                                     f"{_error_message(detail)}", "response_not_found",
                                     status=404, unsent=True)
                if response.status >= 500 and response.status != 501:
                    detail = await response.read(_ERROR_BODY_LIMIT)
                    log.warning("replica %s answered %s: %s", replica, response.status,
                                detail.decode(errors="replace"))
                    raise _Retryable("5xx", f"replica {replica!r} answered {response.status}"
                                     f"{_error_message(detail)}", status=response.status,
                                     unsent=True)
                if response.status < 200 or 300 <= response.status < 400:
                    # a redirect, or a status no HTTP server answers (under 100; a 1xx is
                    # the parser's): no answer, and neither its Location nor its body
                    # reaches the client, which may follow it with the prompt
                    log.warning("replica %s answered %s, which is no answer", replica,
                                response.status)
                    redirect = response.status >= 300
                    raise _Retryable("3xx" if redirect else "broken",
                                     f"replica {replica!r} answered {response.status}, "
                                     "which is no answer"
                                     f"{' (a redirect is not followed)' if redirect else ''}",
                                     status=response.status, unsent=True)
                first = await response.readany()
                if response.status == 400 and rest:
                    first = await self._context_refusal(replica, response, first, rest)
                first_byte_s = time.perf_counter() - started
                streamed = "text/event-stream" in response.headers.get("content-type", "")
                failed: _Failure | None = None  # the failure the stream opened with
                if streamed and not first and response.status < 400:
                    raise UpstreamBroken("the stream ended before its first event")
                if streamed and response.status < 400 and (
                        signs.failed_events
                        or first.lstrip(b"\r\n").startswith(_ERROR_EVENTS)):
                    # a stream that opens with its failure (vLLM's error event, a Responses
                    # stream's ``error`` or ``response.failed``) the client has seen
                    # nothing of yet: a server's failure is tried elsewhere, as a 5xx is.
                    # The replica took the prompt (it failed on it): not ``unsent``
                    first = await _first_event(response, first)
                    failed = _stream_opening_failure(first, signs.failed_events)
                    if failed is not None and failed.status >= 500:
                        log.warning("replica %s answered %s in its stream: %s", replica,
                                    failed.status, failed.message)
                        raise _Retryable("5xx", f"replica {replica!r} answered "
                                         f"{failed.status} in its stream"
                                         f"{': ' + failed.message if failed.message else ''}",
                                         status=failed.status)
            if patience is not None:  # its timer is done with
                patience.cancel()
            if not streamed and response.status < 400:
                first, body_waited_s = await self._buffer(replica, response, first)
                if response.is_eof():  # held whole: the client has seen nothing of it
                    whole = _read_held(first, response.headers, response.until_close,
                                       signs)
                    if whole.cut is not None:
                        log.warning("replica %s answered a cut body (%s)", replica,
                                    whole.cut)
                        raise _Retryable("broken", f"replica {replica!r} answered a cut "
                                         f"body ({whole.cut})")
                    if whole.empty is not None:
                        log.warning("replica %s answered %s with %s", replica,
                                    response.status, whole.empty)
                        raise _Retryable("empty", f"replica {replica!r} answered "
                                         f"{response.status} with {whole.empty}")
        except UpstreamFailure as exc:  # refused, reset, cut, or a malformed answer
            _close(response)
            if isinstance(exc, UpstreamUnreachable):
                if self.fleet.eject(replica, str(exc)):
                    log.warning("replica %s ejected: %s", replica, exc)
                # the client is told the kind of failure; its detail (the address, the
                # OS's or TLS's words) goes to the log and /admin/replicas
                raise _Retryable("connect", f"replica {replica!r} {exc.cause}",
                                 "upstream_unreachable", unsent=True) from None
            raise _Retryable("broken", f"replica {replica!r} {exc.cause}") from None
        except TimeoutError:
            _close(response)
            if patience is not None and patience.at_deadline:
                raise _Retryable("deadline", f"the request's first-byte deadline "
                                 f"({self.timeouts.first_byte_s:g} s) ran out while replica "
                                 f"{replica!r} was busy with other requests",
                                 "upstream_timeout") from None
            raise _Retryable("timeout", f"replica {replica!r} sent no byte within "
                             f"{wait:.3g} s while showing no progress",
                             "upstream_timeout") from None
        except asyncio.CancelledError:
            _close(response)
            if waiting.why is None:
                raise  # a client disconnect, or the server's own cancel
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if waiting.why == _SHUTDOWN:
                raise ServiceUnavailable(  # another copy (or this one, restarted) may serve
                    f"the gateway shut down before replica {replica!r} sent a first byte",
                    code="gateway_shutdown", headers={"Retry-After": "1"}) from None
            raise _Retryable("ejected", f"replica {replica!r} was ejected while the "
                             "request waited for it") from None
        except BaseException:  # _Retryable
            _close(response)
            raise
        finally:
            if patience is not None:
                patience.cancel()
            held = self._waiting.get(replica)
            if held is not None:
                held.discard(waiting)
                if not held:
                    del self._waiting[replica]
        self.fleet.first_byte(pending)
        self.metrics.first_byte(replica, first_byte_s)
        if response.status < 400:
            if pending.state is not None:
                pending.state.made_progress()
            if streamed:
                self.first_byte.observe(first_byte_s, pending.tokens)
        return UpstreamStream(replica, response, first, pending, self.timeouts.idle_s,
                              self.fleet, on_done, first_byte_s, self._cut,
                              signs, self.relaying,
                              failed.status if failed is not None else None, whole.answer,
                              body_waited_s)

    async def _context_refusal(self, replica: str, response: UpstreamResponse,
                               first: bytes, rest: Sequence[str]) -> bytes:
        """A 400's body (its first ``_ERROR_BODY_LIMIT`` bytes at least, ``first`` those
        read), to relay; ``_ContextTooLong`` where it refuses the prompt as longer than
        ``replica``'s context and one of ``rest`` serves the model with a longer one."""
        while len(first) < _ERROR_BODY_LIMIT and not response.is_eof():
            more = await response.readany()
            if not more:
                break
            first += more
        limit = _context_limit(first)
        if limit is None:
            return first
        longer = self.fleet.longer_context(limit[0], replica, rest)
        if not longer:
            return first
        log.debug("replica %s refused a prompt over its context of %d tokens; trying %s",
                  replica, limit[0], longer[0])
        raise _ContextTooLong(replica, limit[0], limit[1], longer)

    async def _buffer(self, replica: str, response: UpstreamResponse,
                      first: bytes) -> tuple[bytes, float]:
        """A non-streamed answer read up to ``buffer_bytes`` (the rest is relayed), and the
        seconds that took. A body that has begun comes whole within ``idle_s`` (vLLM and
        SGLang send it at once, when the answer is done): the whole read is bounded, not
        each read, so a replica that trickles its body is left as a silent one is."""
        chunks, size = [first], len(first)
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            async with asyncio.timeout(self.timeouts.idle_s):
                while size < self.timeouts.buffer_bytes and not response.is_eof():
                    chunk = await response.readany()
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
        except TimeoutError:
            raise _Retryable("idle_timeout", f"replica {replica!r} began its answer but did "
                             f"not send it whole within timeouts.idle_s "
                             f"({self.timeouts.idle_s:g} s)", "upstream_timeout") from None
        return b"".join(chunks), loop.time() - began

    def _count_failure(self, replica: str, exc: _Retryable) -> None:
        if exc.cause in ("connect", "ejected", "deadline"):
            return  # ejected already, or the request's time ran out there
        if self.fleet.request_failed(replica, str(exc), self.health.request_failures_to_eject,
                                     self.health.ejection_s):
            log.warning("replica %s ejected after %d failed requests in a row (last: %s)",
                        replica, self.health.request_failures_to_eject, exc)

    def _cut(self, stream: UpstreamStream) -> None:
        assert stream.cut is not None
        self.metrics.cut(stream.replica, stream.cut)
        error = f"answer cut ({stream.cut})"
        to_eject, ejection_s = self.health.request_failures_to_eject, self.health.ejection_s
        # a failed request, as a failed try is (the next answer opened ends that run), and
        # one of a run of cuts that only a whole answer of its kind ends
        if self.fleet.request_failed(stream.replica, error, to_eject, ejection_s):
            log.warning("replica %s ejected after %d failed requests in a row (last: %s)",
                        stream.replica, to_eject, error)
        elif self.fleet.answer_cut(stream.replica, stream.stream, error, to_eject, ejection_s):
            log.warning("replica %s ejected after %d %s in a row cut, none whole between "
                        "them (last: %s)", stream.replica, to_eject,
                        "streams" if stream.stream else "bodies", stream.cut)


def _siblings_last(order: Sequence[str], at: int, failed: ReplicaState) -> Sequence[str]:
    """``order`` with the replicas from ``at`` on rearranged after a try on ``failed``
    failed: when it is a data-parallel rank, the other ranks of its server go last (they
    share its API process and its port, so a server that is down, hung or failing fails
    them too, and two of its ranks failing a request says nothing of the request:
    ``gateway.data_parallel``); else ``order`` itself, never copied."""
    if failed.config.data_parallel_rank is None:
        return order
    group = group_of(failed.id)
    rest = order[at:]
    return (*order[:at], *(r for r in rest if group_of(r) != group),
            *(r for r in rest if group_of(r) == group))


class _Patience:
    """Pushes a try's ``timer`` back by ``wait`` (up to ``deadline``, monotonic) each time
    it is about to fire after the replica made progress since it was set or last pushed."""

    __slots__ = ("_deadline", "_handle", "_loop", "_since", "_state", "_timer", "_wait",
                 "at_deadline")

    def __init__(self, timer: asyncio.Timeout, state: ReplicaState, wait: float,
                 deadline: float) -> None:
        self._loop = asyncio.get_running_loop()  # its time() is time.monotonic()
        self._timer, self._state, self._wait, self._deadline = timer, state, wait, deadline
        self._since = self._loop.time()
        self.at_deadline = False  # pushed back to the request's deadline: if it fires
        # now, the deadline cut a replica that was making progress short
        self._handle = self._loop.call_at(self._since + wait - _CHECK_AHEAD_S, self._check)

    def _check(self) -> None:
        when = self._timer.when()
        if when is None or self._timer.expired() or when >= self._deadline \
                or self._state.progress() <= self._since:
            return  # no progress (or no more time): the wait ends
        now = self._loop.time()
        self._since = now
        until = min(self._deadline, now + self._wait)
        self._timer.reschedule(until)
        self.at_deadline = until >= self._deadline
        self._handle = self._loop.call_at(max(now, until - _CHECK_AHEAD_S), self._check)

    def cancel(self) -> None:
        self._handle.cancel()


def _count(value: object) -> TypeGuard[int]:
    """Whether ``value`` is a token count: an int (not a bool), not negative."""
    return type(value) is int and value >= 0


def _comments_only(before: bytes, chunk: bytes) -> bool:
    """Whether ``chunk``, read after a stream's last bytes ``before`` (all of it when
    shorter than ``_SSE_TAIL``), holds only comment lines (``: ping``, the keep-alives some
    proxies send; vLLM and SGLang send none) and blank lines: no event's field, nothing a
    client takes as progress. A line begun before the kept bytes is no comment's."""
    if before and not before.endswith(_LINE_ENDS):  # the chunk goes on with a line
        start = max(before.rfind(b"\n"), before.rfind(b"\r")) + 1
        if not before.startswith(b":", start) or (start == 0 and len(before) >= _SSE_TAIL):
            return False  # (the line goes on with an event's field: no copy, no split)
        chunk = before[start:] + chunk
    elif chunk[:1] not in _COMMENT_STARTS:  # the usual read: an event's field
        return False
    elif chunk[:1] != b":" and _field_line_ends(before):
        return False  # its line end ends an event whose field came before it
    return all(not line or line.startswith(b":") for line in chunk.splitlines())


def _field_line_ends(before: bytes) -> bool:
    """Whether the last line of ``before`` (which ends with a line end) is an event's
    field: a blank line read next ends that event, as the client sees it."""
    line = before[:-2] if before.endswith(b"\r\n") else before[:-1]
    start = max(line.rfind(b"\n"), line.rfind(b"\r")) + 1
    return start < len(line) and line[start:start + 1] != b":"


def _content_events(before: bytes, chunk: bytes) -> int:
    """The content events that ``chunk`` adds to a stream whose bytes so far end with
    ``before`` (all of them, when fewer than ``_CONTENT_EDGE``) (``content_chunks``): its
    data lines (an event of OpenAI's API has one: JSON escapes a line end in a string, so
    a line never starts inside its value), less its role-only chunks, [DONE] and the
    usage-only event left in (``content_chunks`` takes them off). A few counts in each
    chunk (``\\rdata:`` only where a \\r is), and a sign split between reads counted once,
    where it straddles the chunk's start."""
    if len(before) < _CONTENT_EDGE:  # all of the stream so far: a line starts the body
        before = b"\n" + before
    n = chunk.count(_DATA_LINE) - chunk.count(_ROLE_ONLY)
    if b"\r" in chunk:
        n += chunk.count(_CR_DATA_LINE)
    if before.endswith(_LINE_ENDS):  # the usual read, from a line's start: of the signs
        return n + chunk.startswith(b"data:")  # only a data line's end can begin before
    head = before[-_CONTENT_EDGE:]
    window = head + chunk[:_CONTENT_EDGE]
    # window: [0, cut) before's last bytes | [cut, ...) the chunk's first bytes; a sign of
    # length k straddles the cut where it lies in [cut - k + 1, cut + k - 1)
    cut = len(head)
    for sign, weight in _CONTENT_SIGNS:
        k = len(sign)
        n += weight * window.count(sign, max(0, cut - k + 1), cut + k - 1)
    return n


def _usage_only_last(tail: bytes) -> bool:
    """Whether a stream's last event with data, [DONE] aside, is its usage-only one (its
    choices empty), read from the stream's last bytes: that event's data line is found
    from the end (its content, were it another's, escapes the quotes of the sign)."""
    at = tail.rfind(b"data:")
    if at >= 0 and _ends_done(tail):
        at = tail.rfind(b"data:", 0, at)
    return at >= 0 and tail.find(_USAGE_ONLY, at) >= 0


def _ends_done(tail: bytes) -> bool:
    """Whether a stream's last event with data is its ``[DONE]`` (its blank line perhaps
    still to come). Asked after every chunk relayed: only the tail's last bytes are read,
    and as written by vLLM, SGLang and OpenAI (``data: [DONE]`` last) they are enough.
    Other servers end it otherwise, which SSE reads the same: ``data:[DONE]`` (no space),
    another field after it in its event (``id:``, ``retry:``), keep-alive comments after
    its event; the last events with ``[DONE]`` among them are then read as a client
    does (``_last_data_is_done``). Each was taken for a stream cut short."""
    if tail[-_DONE_WINDOW:].rstrip(b"\r\n").endswith(_DONE_DATA):
        return True
    window = tail[-_DONE_LOOK_BACK:]
    return window.rfind(_DONE_MARK) >= 0 and _last_data_is_done(window)


def _last_data_is_done(window: bytes) -> bool:
    """Whether the last event with data in ``window`` (a stream's last bytes) is [DONE]:
    its data begins so, as the ``openai`` client reads it (events of comments and other
    fields alone carry no data)."""
    text = window.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    for event in reversed(text.split(b"\n\n")):
        data = _event_data(event)
        if data is not None:
            return data.startswith(_DONE_MARK)
    return False


class _StreamEnd(NamedTuple):
    """How a stream's last events read (``_stream_end``)."""

    after_a_piece: bool  # it ended right after a piece of an event
    # the data of its last event that is JSON, and its value, parsed once: its usage is
    # read from it (``_stream_usage``); None when none was parsed
    last_json: tuple[bytes, Any] | None


def _stream_end(tail: bytes, whole: bool) -> _StreamEnd:
    """Whether a stream that ended on its last event ([DONE], or a Responses stream's)
    ended right after a piece of an event (a replica's write cut short, then its end):
    the data of its last event, or of the one with data before it, is neither JSON nor
    [DONE] (the piece is an event of its own, or it and the last event ran into one; the
    events between them that carry no data, keep-alive comments, are passed over). Read
    from the stream's last bytes, ``tail`` (``whole``: all of it); an event that began
    before the tail is not judged. Asked once, when the stream ends."""
    body = tail.rstrip(b"\r\n")  # the last event's own blank line, if it came
    end = len(body)
    last: tuple[bytes, Any] | None = None
    # the last two events with data, found from the end (a split of the whole tail took
    # 50 us for 8 KiB, a share of a streamed request's CPU), by the one blank line a
    # stream without a carriage return can hold (a search for a mark that is absent walks
    # the whole tail)
    marks = _EVENT_ENDS[:1] if b"\r" not in body else _EVENT_ENDS
    judged = 0
    while judged < 2:
        start, width = max((body.rfind(mark, 0, end), len(mark)) for mark in marks)
        if start < 0 and not whole:  # the first event in the tail: judged when it is the
            break  # stream's first
        data = _event_data(body[start + width:end] if start >= 0 else body[:end])
        judged += data is not None
        if data is not None and not data.startswith(_DONE_MARK):
            try:
                value = _loads(data)
            except ValueError:
                return _StreamEnd(True, last)
            if last is None:
                last = (data, value)
        if start < 0:
            break
        end = start
    return _StreamEnd(False, last)


class _Choices:
    """Which choices of a completion's or chat's stream came, and which of them ended with
    a finish reason, noted from its whole events as they are relayed: each event's first
    choice's index (``_CHOICE_INDEX``), and, in an event whose finish reason is not null
    (one per choice in a stream), the indices of its choices that have one (that event's
    data parsed). Every other event costs a search for each of the two and no parse.

    ``unfinished``: the choices that came without a finish reason once the stream told one
    for any of its choices (vLLM and SGLang end each of a request's ``n`` choices with its
    own, then send the usage, then [DONE]): their answers were cut, though [DONE] came. A
    stream that tells none at all is judged by its [DONE] alone; so is one whose finish
    events do not parse where they are found (a ``data:`` line of their own), or with more
    than ``_MAX_CHOICES`` choices: no choice is then called unfinished. Only the streams of
    requests that ask several choices are noted so (``answer_signs``); a stream of one
    notes only whether its choice finished (``_OneFinish``)."""

    __slots__ = ("chose", "finished", "seen", "unjudged")

    def __init__(self) -> None:
        # the indices' JSON digits (one way to write each: JSON numbers have no leading 0)
        self.seen: set[bytes] = set()
        self.finished: set[bytes] = set()
        self.unjudged = False
        # an event whose choices are not empty came (whatever key its choices put first)
        self.chose = False

    def none(self) -> bool:
        """Whether no event of the stream had a choice (none noted, and none of its events
        was too long to note)."""
        return not (self.chose or self.seen or self.unjudged)

    def note(self, events: bytes) -> None:
        """Note the choices of ``events``, whole events of the stream (an event longer than
        ``_HOLD_BYTES`` comes in pieces: one that does not parse leaves it unjudged)."""
        if self.unjudged:
            return
        seen = self.seen
        seen.update(_CHOICE_INDEX.findall(events))
        if not (seen or self.chose):
            self.chose = _A_CHOICE.search(events) is not None
        at = events.find(_FINISH_KEY)
        cr: bool | None = None  # whether events hold a \r, once a line is looked for
        while at >= 0:
            after = at + len(_FINISH_KEY)
            if _null_at(events, after):
                at = events.find(_FINISH_KEY, after)
                continue
            # the data line that holds it [start, end), parsed once for all its choices
            start = events.rfind(b"\n", 0, at) + 1
            end = events.find(b"\n", after)
            if cr is None:  # (a search for an absent \r walks to the edge)
                cr = b"\r" in events
            if cr:
                start = max(start, events.rfind(b"\r", 0, at) + 1)
                end_cr = events.find(b"\r", after)
                if end_cr >= 0 and (end < 0 or end_cr < end):
                    end = end_cr
            if end < 0:
                end = len(events)
            self._note_finished(events[start:end])
            at = events.find(_FINISH_KEY, end)
        if len(seen) > _MAX_CHOICES or len(self.finished) > _MAX_CHOICES:
            self.unjudged = True

    def _note_finished(self, line: bytes) -> None:
        if not line.startswith(b"data:"):  # not the event's only data line
            self.unjudged = True
            return
        try:
            for choice in orjson.loads(line.removeprefix(b"data:"))["choices"]:
                index = choice["index"]
                if choice.get("finish_reason") is not None and type(index) is int:
                    self.finished.add(b"%d" % index)
        except (ValueError, TypeError, KeyError):  # no JSON, or not a choices list
            self.unjudged = True

    def unfinished(self) -> list[int]:
        """The choices that came and did not finish, in index order (see the class)."""
        if self.unjudged or not self.finished:
            return []
        return sorted(map(int, self.seen - self.finished))


def _null_at(data: bytes, after: int) -> bool:
    """Whether the value of the key that ends at ``after`` in ``data`` is null."""
    return data[after:after + 8].lstrip(b": \t").startswith(b"null")


class _OneFinish:
    """Whether the choice of a completion's or chat's stream of one choice finished,
    noted as its bytes are read, however long its events: vLLM and SGLang end a choice
    with an event of its finish reason (after every event of its content, perhaps with
    the last), then send a usage event (its choices empty) or, where asked, SGLang's
    hidden states (its finish reason null, its event as long as the model's hidden
    size); a choice that finished stays so. ``unfinished`` once finish reasons came
    (``keyed``: the writer tells them), none of them other than null (``told``): asked
    once, when the stream's [DONE] came. A writer that tells no finish reasons at all is
    judged by its [DONE] alone, unless no choice came at all (``no_choice``: neither a
    finish reason nor an event whose choices are not empty, ``_A_CHOICE``). Each read is
    searched until the finish came: once for the key, until it first comes (and, while
    neither it nor a choice came, once for a choice), and once for a finish that is not
    null (a pattern that starts with the key: JSON strings escape their quotes, so no
    content holds it)."""

    __slots__ = ("chose", "keyed", "told")

    def __init__(self) -> None:
        self.keyed = False  # a finish reason came, null or not
        self.told = False  # one came that is not null: the choice finished
        self.chose = False  # an event with a choice came (asked only until one is keyed)

    def note(self, window: bytes) -> None:
        """Note a read, after the last bytes before it (``_ERROR_LOOK_BACK``, over what
        a key and the first byte of its value split across reads need)."""
        if not self.keyed:
            self.keyed = _FINISH_KEY in window
            if not self.keyed and not self.chose:
                self.chose = _A_CHOICE.search(window) is not None
        if self.keyed and not self.told:
            self.told = _FINISH_TOLD.search(window) is not None

    @property
    def unfinished(self) -> bool:
        return self.keyed and not self.told

    @property
    def no_choice(self) -> bool:
        """No choice came: a finish reason is a choice's, as is an event whose choices
        are not empty."""
        return not self.keyed and not self.chose


def _event_data(event: bytes) -> bytes | None:
    """A server-sent event's data: its ``data:`` lines (each without the one space after
    its colon) joined by line ends; None when it has none (comments only). Its lines end at
    \\r\\n, \\r or \\n, which are what ``bytes.splitlines`` splits on."""
    lines = [line[5:].removeprefix(b" ") for line in event.splitlines()
             if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _json_body(headers: Mapping[str, str]) -> bool:
    """Whether an answer's body is JSON, not encoded."""
    return "json" in headers.get("content-type", "").lower() \
        and headers.get("content-encoding", "identity").lower() in _IDENTITY


def _parsed(body: bytes) -> Any:
    """``body``'s JSON value, ``_NO_JSON`` when it is none."""
    try:
        return _loads(body)
    except ValueError:
        return _NO_JSON


def _loads(data: bytes) -> Any:
    """A replica's JSON: read strictly (orjson), else, where it holds what orjson refuses
    and Python's ``json`` (the ``openai`` client's) takes, as that reads it: ``NaN`` and
    ``-Infinity`` (a logprob of minus infinity, as Python's ``json`` writes it), a byte
    order mark; such an answer read as cut. ValueError when neither reads it (a cut body
    is not read twice; one nested past the interpreter's depth is no JSON)."""
    try:
        return orjson.loads(data)
    except ValueError:
        if not (data.startswith(_BOM) or b"NaN" in data or b"Infinity" in data):
            raise
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None


class _LongAnswer:
    """A known answer's success relayed past ``buffer_bytes``, its head sent already:
    what ``_read_held`` judges of one held whole and its framing does not tell, followed
    as its bytes pass (its JSON ending short is ``_json_cut``'s). An encoded one's
    compressed stream, under a length or chunks (``EncodedEnd``: one that ends with its
    connection is followed by the connection); a completion's or chat's choice with a
    null finish reason, found by its key (``_null_finish``). A cut one is left unfinished
    for the client and counted failed, as one whose JSON ends short is."""

    __slots__ = ("_encoded", "_unfinished")

    def __init__(self, encoded: EncodedEnd | None) -> None:
        self._encoded = encoded
        self._unfinished = False  # a choice came with a null finish reason

    @classmethod
    def of(cls, response: UpstreamResponse, signs: AnswerSigns) -> _LongAnswer | None:
        """One for ``response`` where it has something to follow, else None."""
        headers = response.headers
        if _json_body(headers):
            return cls(None) if signs.choices or signs.last_finish else None
        encoded = None if response.until_close else EncodedEnd.of(headers)
        return None if encoded is None else cls(encoded)

    def note(self, chunk: bytes, window: bytes) -> None:
        """``chunk``, the body's next bytes; ``window``, them after the bytes before them
        (``_ERROR_LOOK_BACK``, over the 22 a finish reason's key and value split across
        reads need)."""
        if self._encoded is not None:
            self._encoded.feed(chunk)
        elif not self._unfinished:
            self._unfinished = _null_finish(window)

    def cut(self) -> str | None:
        """Why the body, read to its end, is cut; None where nothing tells it is."""
        if self._encoded is not None and self._encoded.cut:
            return "its compressed stream ends short"
        return "a choice has a null finish reason" if self._unfinished else None


def _null_finish(data: bytes) -> bool:
    """Whether ``data``, a completion's or chat's JSON, holds a null finish reason (JSON
    strings escape their quotes: no content holds the key)."""
    at = data.find(_FINISH_KEY)
    while at >= 0:
        after = at + len(_FINISH_KEY)
        if _null_at(data, after):
            return True
        at = data.find(_FINISH_KEY, after)
    return False


class _Held(NamedTuple):
    """A non-streamed answer held whole, as ``_read_held`` read it."""

    answer: Any  # its JSON value (``_NO_JSON``: none), or ``_UNPARSED`` where not read
    cut: str | None  # why it is cut, if it is
    # what it carries in place of an answer, where it carries none (``_carries_nothing``)
    empty: str | None = None


def _read_held(body: bytes, headers: Mapping[str, str], until_close: bool,
               signs: AnswerSigns) -> _Held:
    """A non-streamed answer's whole ``body``, held before the client sees a byte, parsed
    once (its usage and status are read from that value at its end) where it is JSON and
    its end is to be judged: an answer the gateway knows (``signs.whole_json``: it is one
    JSON value), or one that ended with its connection (which a replica that died ends
    too). It is cut where its JSON ends short, and where an encoded one's compressed
    stream ends short (``encoded_cut``; an answer that ended with its connection had
    that judged as it came). A completion's or chat's whose choice came with a null
    finish reason is the replica's answer cut too, as a stream of it is
    (``_unfinished_choice``). A known answer's success that carries nothing is no answer
    either (``empty``): no body (a 204, or a 200 with none), or a completion's or chat's
    that is an error object, or has no choice where the request asked one
    (``_carries_nothing``). Any other answer (a pass-through one with a length or chunks:
    its transport tells) is not read here."""
    if not (signs.whole_json or until_close):
        return _Held(_UNPARSED, None)
    if signs.whole_json and (not body or body.isspace()):
        return _Held(_UNPARSED, None, "no body")
    if not _json_body(headers):
        if signs.whole_json and not until_close and encoded_cut(body, headers):
            return _Held(_UNPARSED, "its compressed stream ends short")
        return _Held(_UNPARSED, None)
    answer = _parsed(body)
    if answer is _NO_JSON:
        return _Held(answer, "its JSON ends short")
    if signs.choices or signs.last_finish:
        unfinished = _unfinished_choice(answer)
        if unfinished is not None:
            return _Held(answer, f"choice {unfinished} has a null finish reason")
        return _Held(answer, None, _carries_nothing(answer, signs.some_choice))
    return _Held(answer, None)


def _carries_nothing(answer: Any, some_choice: bool) -> str | None:
    """What a completion's or chat's whole ``answer`` carries in place of one: an error
    object and no ``choices`` (vLLM's nested ``error``, older vLLM's and SGLang's flat
    ``"object": "error"``: a replica that answers its error with a success status), or
    ``choices`` empty where the request asked at least one choice (``some_choice``: not
    a request whose ``n`` the replica may read as none); None when it carries an answer,
    or is no object (judged no further)."""
    if not isinstance(answer, dict):
        return None
    if "choices" not in answer:
        error = _openai_error(answer)
        return None if error is None else f"an error object and no choice{_message_of(error)}"
    if some_choice and answer["choices"] == []:
        return "no choice (its choices empty)"
    return None


def _unfinished_choice(answer: Any) -> int | None:
    """The index of the first choice of a completion's or chat's whole ``answer`` whose
    finish reason is null (vLLM and SGLang end each with one; a writer that leaves the
    key out tells none, and is not judged); None when none is."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list):
        return None
    for at, choice in enumerate(choices):
        if isinstance(choice, dict) and "finish_reason" in choice \
                and choice["finish_reason"] is None:
            index = choice.get("index")
            return index if type(index) is int else at
    return None


async def _first_event(response: UpstreamResponse, first: bytes) -> bytes:
    """``first`` and what follows it up to the end of a stream's first event (or of its
    body, or ``_ERROR_BODY_LIMIT`` bytes)."""
    while not any(end in first for end in _EVENT_ENDS) and len(first) < _ERROR_BODY_LIMIT:
        chunk = await response.readany()
        if not chunk:
            break
        first += chunk
    return first


def _error_event(window: bytes) -> int | None:
    """The status an error event in a stream's ``window`` of bytes tells: its ``code``
    when that is a 4xx or 5xx, else (none, or the event not whole in ``window``) 502;
    for an aborted answer (``_ABORTS``), SGLang's ``status_code`` after it on its line
    when that is a 4xx or 5xx, else 502; None when ``window`` holds neither (a whole
    answer's bytes are searched the same way: an abort is all they can hold). An event's
    data is JSON, whose strings escape their quotes: ``data: {"error"`` starts a line of
    an event, never content, and ``"abort"`` is no content's. Every marker holds one of
    two quoted words: a chunk is searched for those two, and for the markers only after a
    hit."""
    if b'"error"' not in window and b'"abort"' not in window:
        return None
    for start in _ERROR_EVENTS:
        at = window.find(start)
        if at >= 0:
            end = window.find(b"\n", at)
            try:
                data = orjson.loads(window[at + len(b"data:"):end if end >= 0 else None])
            except ValueError:
                data = None
            error = data.get("error") if isinstance(data, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            return code if type(code) is int and 400 <= code < 600 else 502
    for marker in _ABORTS:
        at = window.find(marker)
        if at >= 0:
            end = window.find(b"\n", at)
            found = _STATUS_CODE.search(window, at, end if end >= 0 else len(window))
            code = int(found.group(1)) if found else 502
            return code if 400 <= code < 600 else 502
    return None


class _Failure(NamedTuple):
    """What a stream's opening failure event tells: a status, and its message (cut short;
    '' when it has none)."""

    status: int
    message: str


# the error codes of OpenAI's Responses API that name the request's own fault (its prompt,
# its images): answered as they came, never tried elsewhere
_REQUEST_FAULTS = ("invalid_", "image_", "empty_image", "unsupported_image",
                   "failed_to_download_image")


def _stream_opening_failure(first: bytes, failed: tuple[bytes, ...]) -> _Failure | None:
    """The failure a stream's first event tells, read from ``first``, its first bytes: an
    error event (``_ERROR_EVENTS``, vLLM's and SGLang's under a 200) with its status
    (``_error_event``) and its error's message; else one of ``failed``
    (``_opening_failure``); None for any other first event."""
    body = first.lstrip(b"\r\n")
    if body.startswith(_ERROR_EVENTS):
        status = _error_event(first)
        if status is not None:
            data = body[len(b"data:"):].split(b"\n", 1)[0]
            return _Failure(status, _error_message(data).removeprefix(": "))
    return _opening_failure(first, failed) if failed else None


def _opening_failure(first: bytes, failed: tuple[bytes, ...]) -> _Failure | None:
    """The failure a stream's first event tells when it is one of ``failed`` (a Responses
    stream's ``error`` or ``response.failed``), read from ``first``, its first bytes;
    None for any other first event. The status: the error's ``code`` when that is a 4xx
    or 5xx status; 429 for ``rate_limit_exceeded``; 400 for a code that names the
    request's fault (``_REQUEST_FAULTS``); else (``server_error``, another, or none, or
    the event not whole) 502. The error is OpenAI's error event itself, vLLM's nested
    ``error`` object, or a failed response's ``error``."""
    body = first.lstrip(b"\r\n")
    ends = [at + len(mark) for mark in _EVENT_ENDS if (at := body.find(mark)) >= 0]
    event = body[:min(ends)] if ends else body
    if not any(marker in b"\n" + event for marker in failed):
        return None
    try:
        data = orjson.loads(_event_data(event) or b"")
    except ValueError:
        data = None
    error = _openai_error(data)
    if error is None and isinstance(data, dict):
        response = data.get("response")
        error = response.get("error") if isinstance(response, dict) else None
        if not isinstance(error, dict):
            error = data  # OpenAI's error event: its code and message at its top
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if type(code) is int and 400 <= code < 600:
        status = code
    elif code == "rate_limit_exceeded":
        status = 429
    elif isinstance(code, str) and code.startswith(_REQUEST_FAULTS):
        status = 400
    else:
        status = 502
    return _Failure(status, message[:_ERROR_MESSAGE_CHARS] if isinstance(message, str)
                    else "")


def _context_limit(body: bytes) -> tuple[int, BadRequest] | None:
    """The context in tokens that a replica's 400 ``body`` refuses the prompt as longer
    than (``_CONTEXT_LIMIT``: vLLM's, SGLang's and the engine's words, nested under
    ``error`` or flat beside ``"object": "error"``; llama.cpp's ``n_ctx`` beside its
    ``exceed_context_size_error``), and that error as the client would get it; None for
    any other body."""
    try:
        error = _openai_error(orjson.loads(body))
    except ValueError:
        return None
    message = None if error is None else error.get("message")
    found = _CONTEXT_LIMIT.search(message) if isinstance(message, str) else None
    if error is not None and found is None and error.get("type") == _LLAMA_CPP_CONTEXT:
        # llama.cpp's server: its context beside the message, which names no number
        context = error.get("n_ctx")
        if type(context) is int and context > 0:
            return context, BadRequest(str(message), code=_LLAMA_CPP_CONTEXT)
    if error is None or found is None:
        return None
    param, code = error.get("param"), error.get("code")
    return int(next(g for g in found.groups() if g)), BadRequest(
        str(message), param=param if isinstance(param, str) else None,
        code=code if isinstance(code, str) else None)


def _error_object(body: bytes) -> int | None:
    """The status of a whole answer that is an OpenAI error object (vLLM's
    ``{"error": {...}}``, older vLLM's and SGLang's ``{"object": "error", ...}``): its
    ``code`` when that is a 4xx or 5xx, else (none, or the body not all here) 502; None
    for any other body (only its first bytes are read, unless they open an error)."""
    if _ERROR_OBJECT.match(body) is None:
        return None
    try:
        data = orjson.loads(body)
    except ValueError:
        return 502
    error = data.get("error", data) if isinstance(data, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if type(code) is int and 400 <= code < 600 else 502


def _error_message(detail: bytes) -> str:
    """': <message>' of a replica's OpenAI-shaped error body, cut short: nested under
    ``error`` (OpenAI's, vLLM's since 0.10.2) or flat beside ``"object": "error"``
    (older vLLM's, SGLang's); '' for any other body (its raw text, a trace perhaps, is
    logged, not shown to the client)."""
    try:
        data = orjson.loads(detail)
    except ValueError:
        return ""
    return _message_of(_openai_error(data))


def _openai_error(data: Any) -> dict[str, Any] | None:
    """An OpenAI-shaped error in ``data``: nested under ``error`` (OpenAI's, vLLM's since
    0.10.2), or ``data`` itself when flat beside ``"object": "error"`` (older vLLM's,
    SGLang's), or a message that ``error`` is (TGI's, beside its ``error_type``: read as
    one with that message); None for anything else."""
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        return error
    if isinstance(error, str) and error:
        return {"message": error}
    return data if data.get("object") == "error" else None


def _message_of(error: Any) -> str:
    """': <message>' of an OpenAI error object (parsed), cut short; '' where it has
    none."""
    message = error.get("message") if isinstance(error, dict) else None
    if not message or not isinstance(message, str):
        return ""
    return ": " + message[:_ERROR_MESSAGE_CHARS]


def _close(response: UpstreamResponse | None) -> None:
    if response is not None:
        response.close()
