"""A stored response is continued only under the ``cache_salt`` it was made under (a
tenant's, set by the gateway): under another salt, or with none where it had one (and
the other way round), it is not found, answered as an id never stored is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine.responses_route import ResponseStore
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
SALT_A, SALT_B = "a" * 64, "b" * 64


@pytest.fixture(scope="module")
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _post(live: LiveEngine, **body: Any) -> tuple[int, dict[str, Any]]:
    r = live.http.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 2,
                                               **body})
    return r.status_code, r.json()


def test_a_response_is_continued_only_under_its_own_salt(live: LiveEngine) -> None:
    status, salted = _post(live, input="ACME SECRET: 4242", cache_salt=SALT_A)
    assert status == 200
    status, plain = _post(live, input="nothing secret")
    assert status == 200
    _, unknown = _post(live, input="x", previous_response_id="resp_nowhere")
    assert unknown["error"]["param"] == "previous_response_id"
    for previous, salt in ((salted["id"], SALT_B), (salted["id"], None),
                           (plain["id"], SALT_A)):
        asked = {} if salt is None else {"cache_salt": salt}
        status, refused = _post(live, input="what did I say?", previous_response_id=previous,
                                **asked)
        # the answer an id never stored gets, its id named: nothing tells that it exists
        assert status == 404, refused
        assert refused == {"error": {**unknown["error"], "message": unknown["error"][
            "message"].replace("resp_nowhere", previous)}}
    for previous, salt in ((salted["id"], SALT_A), (plain["id"], None)):
        asked = {} if salt is None else {"cache_salt": salt}
        status, went_on = _post(live, input="and?", previous_response_id=previous, **asked)
        assert status == 200 and went_on["previous_response_id"] == previous
    # a continuation is stored under its own salt too
    status, third = _post(live, input="more", cache_salt=SALT_A,
                          previous_response_id=salted["id"])
    assert status == 200
    assert _post(live, input="x", previous_response_id=third["id"],
                 cache_salt=SALT_B)[0] == 404
    # a salt that breaks the rule is a 400 naming it, before any id is looked up
    status, bad = _post(live, input="x", previous_response_id=salted["id"], cache_salt="")
    assert status == 400 and bad["error"]["param"] == "cache_salt"


def test_the_store_gives_a_conversation_under_its_salt_alone() -> None:
    store = ResponseStore(limit=4, max_chars=10_000)
    turns = [{"role": "user", "content": "hi"}]
    store.put("resp_salted", turns, salt=SALT_A)
    store.put("resp_plain", turns, salt=None)
    store.check_integrity()
    assert store.get("resp_salted", salt=SALT_A) == turns
    assert store.get("resp_plain", salt=None) == turns
    assert store.get("resp_salted", salt=None) is None
    assert store.get("resp_salted", salt=SALT_B) is None
    assert store.get("resp_plain", salt=SALT_A) is None
    # the salt is always said, none included: a caller cannot leave it out by mistake
    with pytest.raises(TypeError, match="salt"):
        store.put("resp_plain", turns)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="salt"):
        store.get("resp_plain")  # type: ignore[call-arg]
