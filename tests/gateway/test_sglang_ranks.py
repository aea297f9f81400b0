"""An SGLang replica whose schedulers report rank by rank (``--pp-size`` > 1, or
``--enable-metrics-for-all-schedulers`` with tensor parallelism) is read as one copy of
each data-parallel group's figures: the stages and TP ranks of a group count the same
requests and one KV pool, so their sum read load and capacity several times too high."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.replica_metrics import parse_metrics
from tests.support.gateway_harness import AUTH, start_gateway
from tests.support.second_sglang import Ranks, metrics_text, sglang_app
from tests.support.waiting import wait_until


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (1, 2), (4, 1), (2, 4)])
def test_a_groups_ranks_are_read_once(tp: int, pp: int) -> None:
    scraped = parse_metrics(metrics_text(Ranks(tp=tp, pp=pp)))
    assert scraped.dialect == "sglang"
    assert (scraped.running, scraped.waiting, scraped.kv_capacity_tokens) == (3, 2, 100_000)
    assert scraped.kv_usage == 0.25 and scraped.hit_rate_gauge == 0.5
    assert scraped.work_tokens == 1200.0


def test_data_parallel_groups_add_up_and_a_stage_with_less_kv_bounds_its_group() -> None:
    scraped = parse_metrics(metrics_text(Ranks(tp=2, pp=2, dp=(0, 1))))
    assert (scraped.running, scraped.waiting, scraped.kv_capacity_tokens) == (6, 4, 200_000)
    text = metrics_text(Ranks(pp=2)).replace(
        'sglang:max_total_num_tokens{engine_type="unified",model_name="m",pp_rank="1",'
        'tp_rank="0"} 100000.0', 'sglang:max_total_num_tokens{engine_type="unified",'
        'model_name="m",pp_rank="1",tp_rank="0"} 90000.0')
    assert parse_metrics(text).kv_capacity_tokens == 90_000


def test_the_gateway_reads_a_pipelined_replica_as_one(serve: Any) -> None:
    replica = serve(sglang_app(Ranks(tp=2, pp=2)))
    gw = start_gateway(serve, [("s", replica.url)])

    def seen() -> dict[str, Any] | None:
        rows = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
        return rows[0] if rows and rows[0]["dialect"] == "sglang" else None

    wait_until(lambda: seen() is not None, 10, "the replica's first scrape")
    row = seen()
    assert row is not None
    assert (row["running"], row["waiting"], row["kv_capacity_replica_tokens"]) \
        == (3, 2, 100_000), row


def test_a_pool_of_no_tokens_or_fewer_is_no_capacity() -> None:
    # a foreign server's odd gauge: no capacity is known from it, not a negative one
    sglang = ("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n"
              "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens {}\n")
    for value in ("-1", "0"):
        assert parse_metrics(sglang.format(value)).kv_capacity_tokens is None
    vllm = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
            "# TYPE vllm:cache_config_info gauge\n"
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="-5"} 1\n')
    assert parse_metrics(vllm).kv_capacity_tokens is None
