"""``max_completion_tokens`` is a chat request's field: vLLM's completion request has none
and serves a completion that sends one (an unknown field, ignored), so neither the
gateway's checks nor the engine's refuse a completion for its value."""

from __future__ import annotations

import pytest

from engine.generate_params import parse_generate
from kvwire.openai_schema import BadRequest, parse_fields

MODEL = "sim"
ODD_VALUES = [0, -3, "lots", {"a": 1}]


@pytest.mark.parametrize("value", ODD_VALUES)
def test_a_completion_is_not_refused_for_a_max_completion_tokens_it_ignores(value: object
                                                                           ) -> None:
    body = {"model": MODEL, "prompt": "the parties agree", "max_tokens": 5,
            "max_completion_tokens": value}
    for lenient in (False, True):  # the engine's checks, the gateway's
        assert parse_fields(body, chat=False, lenient=lenient).max_tokens == 5
    assert parse_generate(body, chat=False, model_name=MODEL, vocab_size=1000).max_tokens == 5


def test_a_chat_still_reads_and_checks_max_completion_tokens() -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 5}
    assert parse_fields({**chat, "max_completion_tokens": 3}, chat=True).max_tokens == 3
    with pytest.raises(BadRequest) as refused:
        parse_fields({**chat, "max_completion_tokens": 0}, chat=True)
    assert refused.value.param == "max_completion_tokens"
    assert "got 0" in refused.value.message
