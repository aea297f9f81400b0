"""The engine's stored responses read and deleted with the official openai client:
``responses.retrieve`` gives the response object as its create call answered it,
``responses.input_items.list`` its own input's items (newest first, paged by ``limit`` and
``after``), ``responses.delete`` forgets it (neither retrieved nor continued after), and
``responses.cancel`` is OpenAI's 400 for a response not made in the background. Each is its
tenant's (``x-kvgate-tenant``): another tenant's id is a 404 as an unknown one is."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from engine.responses_route import ResponseStore
from kvwire.bounded_memo import BoundedMemo
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "tiny-sim"
TENANT = "x-kvgate-tenant"


@pytest.fixture(scope="module")
def engine() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, MODEL)


def _client(engine: LiveEngine, tenant: str | None) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.url + "/v1", api_key="unused", max_retries=0,
                         default_headers={TENANT: tenant} if tenant else None)


def test_retrieve_gives_back_the_response_as_answered(engine: LiveEngine) -> None:
    with _client(engine, "acme") as acme, _client(engine, "evil") as evil, \
            _client(engine, None) as anonymous:
        made = acme.responses.create(model=MODEL, input="remember 4242", max_output_tokens=3,
                                     instructions="be brief", metadata={"k": "v"})
        got = acme.responses.retrieve(made.id)
        assert got.model_dump() == made.model_dump()
        assert got.status in ("completed", "incomplete") and got.instructions == "be brief"
        assert got.output_text and got.usage is not None
        streamed = list(acme.responses.create(model=MODEL, input="again", stream=True,
                                              max_output_tokens=2))
        last = streamed[-1]
        assert last.type in ("response.completed", "response.incomplete")
        assert acme.responses.retrieve(last.response.id).model_dump() == \
            last.response.model_dump()
        for other in (evil, anonymous):  # another tenant's, or none's: unknown
            with pytest.raises(openai.NotFoundError) as caught:
                other.responses.retrieve(made.id)
            assert caught.value.body["param"] == "response_id"  # type: ignore[index]
            with pytest.raises(openai.NotFoundError):
                other.responses.delete(made.id)
            with pytest.raises(openai.NotFoundError):
                other.responses.input_items.list(made.id)
        with pytest.raises(openai.NotFoundError) as unknown:
            acme.responses.retrieve("resp_never")
        assert unknown.value.body == caught.value.body | {  # type: ignore[operator]
            "message": "Response with id 'resp_never' not found."}


def test_delete_forgets_it_for_retrieve_and_continuation(engine: LiveEngine) -> None:
    with _client(engine, "acme") as acme:
        made = acme.responses.create(model=MODEL, input="forget me", max_output_tokens=2)
        gone = acme.responses.delete(made.id)  # openai's delete returns None
        assert gone is None
        raw = engine.http.delete(f"/v1/responses/{made.id}", headers={TENANT: "acme"})
        assert raw.status_code == 404, raw.text
        with pytest.raises(openai.NotFoundError):
            acme.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError) as cont:
            acme.responses.create(model=MODEL, input="go on", previous_response_id=made.id)
        assert cont.value.body["param"] == "previous_response_id"  # type: ignore[index]
        kept = acme.responses.create(model=MODEL, input="keep me", max_output_tokens=2)
        deleted = engine.http.delete(f"/v1/responses/{kept.id}", headers={TENANT: "acme"})
        assert deleted.json() == {"id": kept.id, "object": "response", "deleted": True}


def test_input_items_list_its_own_input_newest_first(engine: LiveEngine) -> None:
    with _client(engine, "acme") as acme:
        first = acme.responses.create(model=MODEL, input="turn one", max_output_tokens=2)
        made = acme.responses.create(
            model=MODEL, previous_response_id=first.id, max_output_tokens=2, input=[
                {"role": "user", "content": "a"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
                {"role": "user", "content": [{"type": "input_text", "text": "b"}]}])
        items = acme.responses.input_items.list(made.id)
        kinds = [(i.type, getattr(i, "role", None)) for i in items.data]
        assert kinds == [("message", "user"), ("function_call_output", None),
                         ("function_call", None), ("message", "user")]  # not turn one's
        assert items.data[0].content[0].text == "b"  # type: ignore[union-attr]
        assert items.data[2].name == "f" and items.data[1].output == "42"  # type: ignore
        assert not items.has_more and items.first_id == items.data[0].id
        # paged two at a time, oldest first: the client follows ``after``
        asc = acme.responses.input_items.list(made.id, limit=2, order="asc")
        assert asc.has_more and [i.id for i in asc.data] == [i.id for i in items.data][:-3:-1]
        every = [i.id for i in acme.responses.input_items.list(made.id, limit=2, order="asc")]
        assert every == [i.id for i in reversed(items.data)]
        bad = engine.http.get(f"/v1/responses/{made.id}/input_items?limit=101",
                              headers={TENANT: "acme"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_cancel_is_refused_for_a_response_not_made_in_the_background(
        engine: LiveEngine) -> None:
    with _client(engine, "acme") as acme:
        made = acme.responses.create(model=MODEL, input="hi", max_output_tokens=2)
        with pytest.raises(openai.BadRequestError) as caught:
            acme.responses.cancel(made.id)
        assert caught.value.body["message"] == "Cannot cancel a synchronous response."  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            acme.responses.cancel("resp_never")
        assert acme.responses.retrieve(made.id).status == made.status  # left as it was


def test_the_store_counts_what_a_response_object_holds() -> None:
    store = ResponseStore(limit=8, max_chars=1 << 20)
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    store.put("bare", turns, salt=None)
    bare = store.chars
    answer = {"id": "r", "instructions": "i" * 1000, "tools": [{"name": "t" * 500}],
              "metadata": {"k": "v" * 300}}
    store.put("kept", turns, salt=None, tenant="acme", answer=answer)
    assert store.chars - bare >= 1800
    store.check_integrity()
    assert store.stored("kept", tenant="evil") is None
    assert not store.delete("kept", tenant=None) and store.delete("kept", tenant="acme")
    assert store.chars == bare
    store.check_integrity()



def test_a_memo_forgets_a_key_and_its_weight() -> None:
    """What the gateway's record of a deleted response is dropped with."""
    memo: BoundedMemo[str, str] = BoundedMemo(4, weight=len, max_weight=100)
    memo.put("a", "xyz")
    memo.put("b", "pq")
    assert memo.pop("a", None) == "xyz" and memo.pop("a", None) is None
    assert memo.weight == 2 and memo.items() == [("b", "pq")]
