"""Text decoded from tokens pushed many at a time (``/detokenize`` of a long list, in
pieces of 2,000) keeps a character whose bytes a push splits: only that character is held
back, not released as U+FFFD."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.server import _DECODE_PIECE_TOKENS
from engine.text_stream import MAX_PENDING_TOKENS, TextStream
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_servers import LiveEngine, serve_engine

SMILE = "\U0001f642"


@pytest.fixture
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, "m")


def test_detokenize_keeps_a_character_across_its_pieces(live: LiveEngine) -> None:
    tokenizer = live.server.tokenizer
    smile = tokenizer.encode(SMILE)
    assert len(smile) > 1  # one token per byte
    bang = tokenizer.encode("!")
    # the first piece the server decodes ends inside the emoji
    tokens = bang * (_DECODE_PIECE_TOKENS - 2) + smile + bang * 10
    said = live.http.post("/detokenize", json={"model": "m", "tokens": tokens})
    assert said.status_code == 200, said.text
    assert said.json()["prompt"] == tokenizer.decode(tokens)
    assert said.json()["prompt"].count(SMILE) == 1


def test_a_long_push_holds_only_its_unfinished_character() -> None:
    tokenizer = load_tokenizer(None)
    smile = tokenizer.encode(SMILE)
    words = tokenizer.encode("a long run of words, several of them, comes before it")
    assert len(words) > MAX_PENDING_TOKENS
    stream = TextStream(tokenizer, ["zz"])
    first = stream.push(words + smile[:2])  # ends inside the emoji
    assert tokenizer.decode(words).startswith(first) and "\ufffd" not in first
    rest = stream.push(smile[2:] + words[:1]) + stream.flush()
    assert first + rest == tokenizer.decode(words + smile + words[:1])
