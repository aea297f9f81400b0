"""A replica's ``usage`` says whether it told its cached tokens: vLLM tells them only with
``--enable-prompt-tokens-details`` (SGLang with ``--enable-cache-report``), and a usage
without them counts 0 cached whatever the replica held."""

from __future__ import annotations

import pytest

from gateway.proxy import Usage, usage_counts


@pytest.mark.parametrize("usage, counts", [
    ({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
     Usage(10, 0, 2, cached_told=False)),
    ({"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": None},
     Usage(10, 0, 2, cached_told=False)),
    ({"prompt_tokens": 10, "completion_tokens": 2,
      "prompt_tokens_details": {"cached_tokens": None}}, Usage(10, 0, 2, cached_told=False)),
    ({"prompt_tokens": 10, "completion_tokens": 2,
      "prompt_tokens_details": {"cached_tokens": 0}}, Usage(10, 0, 2, cached_told=True)),
    ({"prompt_tokens": 10, "completion_tokens": 2,
      "prompt_tokens_details": {"cached_tokens": 8}}, Usage(10, 8, 2, cached_told=True)),
    ({"input_tokens": 10, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 4}},
     Usage(10, 4, 2, cached_told=True)),
    ({"input_tokens": 10, "output_tokens": 2}, Usage(10, 0, 2, cached_told=False)),
])
def test_usage_counts_say_whether_cached_tokens_were_told(usage: dict[str, object],
                                                          counts: Usage) -> None:
    assert usage_counts(usage) == counts


@pytest.mark.parametrize("usage", [
    None, [], {"prompt_tokens": 0}, {"prompt_tokens": -1}, {"prompt_tokens": True},
    {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 11}},
    {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -1}},
])
def test_what_holds_no_counts_is_none(usage: object) -> None:
    assert usage_counts(usage) is None
