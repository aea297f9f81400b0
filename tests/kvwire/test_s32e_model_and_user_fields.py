"""A 404 for a model not served names at most the first ``MODEL_SHOWN_CHARS`` of its
name (a body may hold megabytes of it), and ``user`` (an end user's id) must be a string,
as vLLM's request models read it."""

from __future__ import annotations

import pytest

from kvwire.openai_schema import (
    MODEL_SHOWN_CHARS,
    BadRequest,
    NotFound,
    check_served,
    parse_fields,
)


def test_a_huge_model_name_is_cut_in_the_404() -> None:
    with pytest.raises(NotFound) as info:
        check_served("m" * 1_000_000, "served")
    message = str(info.value)
    assert len(message) < MODEL_SHOWN_CHARS + 64
    assert "m" * MODEL_SHOWN_CHARS + "...`" in message and info.value.param == "model"


def test_a_short_model_name_is_named_whole() -> None:
    with pytest.raises(NotFound, match=r"^The model `nope` does not exist\.$"):
        check_served("nope", "served")


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("user", [5, ["u"], {"id": "u"}, True])
def test_a_user_that_is_no_string_is_a_400_naming_it(chat: bool, user: object) -> None:
    body = {"model": "m", "user": user,
            **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})}
    with pytest.raises(BadRequest) as info:
        parse_fields(body, chat=chat)
    assert info.value.param == "user" and "'user' must be str" in str(info.value)


@pytest.mark.parametrize("chat", [False, True])
def test_a_user_string_or_null_is_taken(chat: bool) -> None:
    for user in ("end-user-7", None):
        body = {"model": "m", "user": user,
                **({"messages": [{"role": "user", "content": "hi"}]} if chat
                   else {"prompt": "hi"})}
        assert parse_fields(body, chat=chat).model == "m"
