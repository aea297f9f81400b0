"""``/detokenize`` reads its ``tokens`` as vLLM's list of ints does (pydantic, lax): an id
sent as ``"72"`` or ``72.0`` is the id 72; a bool, a null, a fraction or other text is a
400 naming it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def test_ids_given_as_numeric_strings_or_whole_floats_are_read_as_ids(
        live: LiveEngine) -> None:
    plain = live.http.post("/detokenize", json={"model": MODEL, "tokens": [72, 105]})
    assert plain.status_code == 200, plain.text
    for tokens in (["72", "105"], [72.0, " 105"], ["72", 105]):
        r = live.http.post("/detokenize", json={"model": MODEL, "tokens": tokens})
        assert r.status_code == 200, (tokens, r.text)
        assert r.json()["prompt"] == plain.json()["prompt"]


@pytest.mark.parametrize(("bad", "named"), [
    (True, "True"), ("seven", "'seven'"), ("7.5", "'7.5'"), (7.5, "7.5"), (None, "None"),
    ([7], "an array")])
def test_a_token_that_is_no_integer_is_refused_naming_it(live: LiveEngine, bad: Any,
                                                         named: str) -> None:
    r = live.http.post("/detokenize", json={"model": MODEL, "tokens": [72, bad]})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tokens" and named in error["message"], error


def test_an_id_read_from_a_string_is_still_checked_against_the_vocabulary(
        live: LiveEngine) -> None:
    r = live.http.post("/detokenize", json={"model": MODEL, "tokens": ["72", "999999"]})
    assert r.status_code == 400 and "999999" in r.json()["error"]["message"], r.text
