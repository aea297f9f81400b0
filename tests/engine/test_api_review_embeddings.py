"""``POST /v1/embeddings``: an input of the wrong shape is refused with a 400 that names
the entry at fault and its value."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine.sim_embedding import SimEmbedder, seed_of
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL, {"embedder": SimEmbedder(16, seed_of("t"))})


@pytest.mark.parametrize(("inputs", "words"), [
    (["a", "b", 3], "got 3 at input[2]"),
    ([[1, 2], "x"], "got 'x' at input[1]"),
    ([5, 6, -1], "got -1 at input[2]"),
    ([5, 1.5], "got 1.5 at input[1]"),
    ([True, 2], "got True at input[0]"),
    ([[1, 2], [3, "z"]], "got 'z' at input[1][1]"),
    ([[1, 2], []], "input 1 must be a non-empty array of token ids"),
    (7, "got 7"),
])
def test_a_bad_input_is_named_with_its_value(live: LiveEngine, inputs: Any,
                                             words: str) -> None:
    r = live.http.post("/v1/embeddings", json={"model": MODEL, "input": inputs})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input" and words in err["message"], err


def test_good_inputs_still_embed(live: LiveEngine) -> None:
    for inputs in ("a b", ["a", "b"], [5, 6], [[5, 6], [7]]):
        r = httpx.post(f"{live.url}/v1/embeddings", json={"model": MODEL, "input": inputs})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == (1 if inputs in ("a b", [5, 6]) else 2)
