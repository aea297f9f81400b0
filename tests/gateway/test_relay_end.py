"""The end of a relayed answer: where the replica's last bytes and the end of its body
arrive together, the client's last chunk and the end of its body go out in one message
(one socket write); where the end comes later, nothing is held back waiting for it."""

from __future__ import annotations

from tests.support.relayed_streams import relayed

_EVENTS = [b'data: {"n": %d}\n\n' % i for i in range(3)] + [b"data: [DONE]\n\n"]


def _relayed(end_apart_s: float | None) -> tuple[list[tuple[bytes, bool, float]], list[bool]]:
    """The client's body messages (body, more_body, seconds since the relay started) and
    how the answer was settled: ``_EVENTS`` each in a write of its own, 0.01 s apart, the
    end of the body in the last event's write (``end_apart_s`` None) or that many seconds
    after it."""
    relay = relayed(_EVENTS, 0.01, end_apart_s, "/v1/completions")
    return relay.sent, relay.ended


def test_the_last_event_goes_out_with_the_end_of_the_body_when_they_come_together() -> None:
    sent, ended = _relayed(None)
    assert b"".join(body for body, _, _ in sent) == b"".join(_EVENTS)
    assert [more for _, more, _ in sent] == [True] * (len(sent) - 1) + [False]
    assert sent[-1][0].endswith(b"data: [DONE]\n\n")  # no empty message after it
    assert ended == [True]


def test_a_late_end_of_body_does_not_hold_back_the_last_event() -> None:
    sent, ended = _relayed(0.3)
    assert b"".join(body for body, _, _ in sent) == b"".join(_EVENTS)
    done = next(i for i, (body, _, _) in enumerate(sent) if body.endswith(b"[DONE]\n\n"))
    assert sent[done][1] is True  # sent as it came, not held for the end
    assert sent[-1][:2] == (b"", False)
    assert sent[-1][2] - sent[done][2] > 0.2  # the end followed when the replica sent it
    assert ended == [True]
