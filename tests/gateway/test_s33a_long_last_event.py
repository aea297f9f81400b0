"""A completion or chat stream of one choice is judged by whether a finish reason other
than null came before its ``[DONE]``, however long its last events: a last content event,
or a usage or hidden-states event after the finish, longer than the bytes of the stream
the gateway keeps (8 KB) neither hides a missing finish reason (the client gets an error
event in place of ``[DONE]``, counted failed) nor one that came (relayed whole, counted
200), whether the events come in one read or several, and wherever a read splits them."""

from __future__ import annotations

import json

import pytest

from tests.support.chat_events import chat, usage
from tests.support.relayed_streams import Relayed, relayed

_DONE = b"data: [DONE]\n\n"
_CHAT_PATH = "/v1/chat/completions"
_LONG = 20_000  # characters: an event over twice the stream's kept tail


_ROLE = chat({"role": "assistant", "content": ""})
_HIDDEN = chat({}, None, hidden_states=[0.125] * (_LONG // 6))  # SGLang's, after the finish


def _sent(out: Relayed) -> bytes:
    return b"".join(body for body, _, _ in out.sent)


def _split_in(events: bytes, at: bytes, into: int) -> list[bytes]:
    """``events`` in two writes, split ``into`` bytes into the last ``at`` in them."""
    cut = events.rindex(at) + into
    return [events[:cut], events[cut:]]


_UNFINISHED = {
    "long_last_content": [_ROLE, chat({"content": "a" * _LONG}), _DONE],
    "long_usage": [_ROLE, chat({"content": "a"}), usage(pad=_LONG), _DONE],
    "long_usage_one_read": [_ROLE + chat({"content": "a"}) + usage(pad=_LONG) + _DONE],
    "null_split_in_its_key": _split_in(_ROLE + chat({"content": "a" * _LONG}) + _DONE,
                                       b'"finish_reason"', 9),
}


@pytest.mark.parametrize("writes", list(_UNFINISHED.values()), ids=list(_UNFINISHED))
def test_a_long_last_event_does_not_hide_a_missing_finish_reason(
        writes: list[bytes]) -> None:
    out = relayed(writes, 0.01, None, _CHAT_PATH, several_choices=False)
    sent = _sent(out)
    head = b"".join(writes)[:-len(_DONE)]
    assert sent.startswith(head) and b"[DONE]" not in sent
    error = json.loads(sent[len(head):].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_unfinished"
    assert out.ended == [False] and out.stream.outcome == "502"


_FINISHED = {
    "long_last_content_with_it": [_ROLE, chat({"content": "a" * _LONG}, "stop"), usage(),
                                  _DONE],
    "long_usage_after_it": [_ROLE, chat({"content": "a"}, "length"), usage(pad=_LONG),
                            _DONE],
    "long_hidden_states_after_it": [_ROLE, chat({"content": "a"}), chat({}, "stop"),
                                    _HIDDEN, usage(), _DONE],
    "long_hidden_states_one_read": [_ROLE + chat({}, "stop") + _HIDDEN + _DONE],
    "split_in_its_key": _split_in(_ROLE + chat({"content": "a"}, "stop")
                                  + usage(pad=_LONG) + _DONE, b'"finish_reason"', 9),
    "split_before_its_value": _split_in(_ROLE + chat({"content": "a"}, "stop")
                                        + usage(pad=_LONG) + _DONE,
                                        b'"finish_reason":', 16),
}


@pytest.mark.parametrize("writes", list(_FINISHED.values()), ids=list(_FINISHED))
def test_a_long_last_event_does_not_hide_a_finish_reason_that_came(
        writes: list[bytes]) -> None:
    out = relayed(writes, 0.01, None, _CHAT_PATH, several_choices=False)
    assert _sent(out) == b"".join(writes)  # relayed as it came, [DONE] and all
    assert out.ended == [True] and out.stream.outcome == "200"


def test_a_writer_that_tells_no_finish_reasons_is_judged_by_its_done() -> None:
    writes = [b'data: {"choices":[{"index":0,"text":"' + b"a" * _LONG + b'"}]}\n\n', _DONE]
    out = relayed(writes, 0.01, None, "/v1/completions", several_choices=False)
    assert _sent(out) == b"".join(writes) and out.ended == [True]
