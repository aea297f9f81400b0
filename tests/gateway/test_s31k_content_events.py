"""A stream's output tokens where it reports no usage (``UpstreamStream.content_chunks``):
its events that carry content, whatever line ends it uses and however its bytes are
split across reads; comments, the usage-only event, role-only chunks and [DONE] are none.
With n > 1 choices, the sum over the choices (as vLLM's ``usage.completion_tokens``)."""

from __future__ import annotations

import pytest

from gateway.proxy import _content_events
from tests.support.relayed_streams import relayed


def _event(data: str, index: int = 0) -> bytes:
    return b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":%d,' \
        b'"delta":{"content":"%s"},"finish_reason":null}]}\n\n' % (index, data.encode())


def _role(index: int = 0) -> bytes:
    return b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":%d,' \
        b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n' % index


_USAGE_ONLY = b'data: {"id":"c","object":"chat.completion.chunk","choices":[],' \
    b'"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
_DONE = b"data: [DONE]\n\n"


def _crlf(data: bytes) -> bytes:
    return data.replace(b"\n", b"\r\n")


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def _counted(writes: list[bytes]) -> int | None:
    """``content_chunks`` of a stream whose replica sends ``writes``, each a read apart
    (a short pause after each), relayed whole to a client that stays."""
    relay = relayed(writes, 0.003, 0.003, "/v1/chat/completions", count_events=True)
    assert relay.ended == [True]
    return relay.stream.content_chunks()


_THREE = _event("a") + _event("b") + _event("c")
_WITH_COMMENTS = b": ping\n\n" + _event("a") + b": keep-alive\n\n" + _event("b") \
    + b": keep-alive\n\n" + _event("c") + _USAGE_ONLY + _DONE


@pytest.mark.parametrize("writes", [
    pytest.param([_WITH_COMMENTS], id="comments-and-usage-only"),
    pytest.param([_crlf(_WITH_COMMENTS)], id="crlf"),
    pytest.param([_WITH_COMMENTS.replace(b"\n", b"\r")], id="cr"),
    pytest.param([_role() + _THREE + _DONE], id="role-chunk"),
    # every sign split between reads: "\ndata:", '"choices":[]', the first "data:"
    pytest.param(_pieces(_WITH_COMMENTS, 8), id="split-lf"),
    pytest.param(_pieces(_crlf(_role() + _THREE + _USAGE_ONLY + _DONE), 11), id="split-crlf"),
])
def test_only_events_with_content_are_counted(writes: list[bytes]) -> None:
    assert _counted(writes) == 3


def test_every_choice_counts_its_own_chunks() -> None:
    """n = 2: each choice opens with a role-only chunk (the second one's in a later read)
    and its content events count: the sum over the choices."""
    writes = [_role(0) + _event("a", 0), _role(1) + _event("x", 1),
              _event("b", 0) + _event("y", 1) + _event("z", 1), _USAGE_ONLY + _DONE]
    assert _counted(writes) == 5


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_every_split_of_a_stream_counts_as_the_whole(line_end: bytes) -> None:
    # the reads of the relay above may merge: here every split of the bytes is counted
    stream = (_role() + b": ping\n\n" + _THREE + _role(1) + _event("d", 1) + _USAGE_ONLY
              + _DONE).replace(b"\n", line_end)
    whole = _content_events(b"\n", stream)
    assert whole == 4 + 1 + 1  # four content events, the usage-only one and [DONE]
    for cut in range(1, len(stream)):
        first, rest = stream[:cut], stream[cut:]
        assert _content_events(b"\n", first) + _content_events(first, rest) == whole, cut
