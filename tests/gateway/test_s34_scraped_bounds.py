"""Scraped gauges no replica can be in (negative counts, a usage past 1) are read as their
bound: a page of negative queues makes its replica look idle, never less than idle."""

from __future__ import annotations

import pytest

from gateway.replica_metrics import parse_metrics

VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} %s
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} %s
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} %s
# TYPE kvgate:num_prompt_tokens_waiting gauge
kvgate:num_prompt_tokens_waiting %s
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} %s
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} %s
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} %s
# TYPE kvgate:num_prompt_tokens_waiting gauge
kvgate:num_prompt_tokens_waiting %s
"""


@pytest.mark.parametrize("page", [VLLM, SGLANG])
def test_negative_counts_read_as_zero_and_usage_within_one(page: str) -> None:
    low = parse_metrics(page % ("-1e9", "-3", "-5.0", "-4096"))
    assert (low.running, low.waiting, low.kv_usage, low.queued_tokens) == (0, 0, 0.0, 0)
    high = parse_metrics(page % ("7", "2", "42.0", "1" + "0" * 300))
    assert (high.running, high.waiting, high.kv_usage) == (7, 2, 1.0)
    assert high.queued_tokens is not None and high.queued_tokens > 10 ** 299
    usual = parse_metrics(page % ("7", "2", "0.25", "4096"))
    assert (usual.running, usual.waiting, usual.kv_usage, usual.queued_tokens) \
        == (7, 2, 0.25, 4096)


def test_an_unknown_dialects_negative_queue_reads_as_zero() -> None:
    page = "# TYPE kvgate:num_prompt_tokens_waiting gauge\nkvgate:num_prompt_tokens_waiting -9\n"
    assert parse_metrics(page).queued_tokens == 0
