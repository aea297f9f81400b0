"""A replica that restarted is noticed from any of its token counters going back, not only
vLLM's prefix-cache ones: an SGLang server exposes none of those."""

from __future__ import annotations

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.fleet_events import FleetEvent
from gateway.kv_capacity_estimate import CapacityEstimator
from gateway.replica_metrics import parse_metrics, stale_copy
from policies.base import ReplicaReset

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{model_name="m"}} 0.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{model_name="m"}} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="m"}} 0.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{{model_name="m"}} 0.6
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{{model_name="m"}} {prompt}
# TYPE sglang:generation_tokens counter
sglang:generation_tokens_total{{model_name="m"}} {generated}
"""


def _page(prompt: float, generated: float) -> str:
    return SGLANG.format(prompt=prompt, generated=generated)


def test_a_restarted_sglang_replica_is_reset_once_and_a_working_one_never() -> None:
    fleet = Fleet([ReplicaConfig("s", "http://127.0.0.1:1")])
    heard: list[FleetEvent] = []
    fleet.listen(heard.append)
    estimator = CapacityEstimator(fleet)
    state = fleet.get("s")
    assert state is not None
    for prompt, generated in ((5_000.0, 900.0), (5_000.0, 900.0), (7_000.0, 1_000.0)):
        assert not fleet.record_scrape("s", parse_metrics(_page(prompt, generated)))
    state.estimated_kv_replica_tokens = 123_456  # as the estimator set it before
    # its scrapes fail for a while (it is down), then it is back, counting from zero
    fleet.record_scrape("s", stale_copy(parse_metrics(_page(7_000.0, 1_000.0))))
    assert fleet.record_scrape("s", parse_metrics(_page(40.0, 3.0)))
    assert state.view().epoch == 1
    assert [e for e in heard if isinstance(e, ReplicaReset)] == [ReplicaReset("s")]
    assert state.estimated_kv_replica_tokens is None  # its old pool's figure went too
    # from then on its counters grow again: no other reset
    assert not fleet.record_scrape("s", parse_metrics(_page(90.0, 9.0)))
    assert not fleet.record_scrape("s", parse_metrics(_page(90.0, 9.0)))
    assert state.view().epoch == 1
    assert estimator.window("s") is None


def test_a_vllm_replica_is_reset_once_when_every_counter_goes_back() -> None:
    page = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} 0.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{model_name="m"}} {n}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{model_name="m"}} {n}
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{model_name="m"}} {n}
"""
    fleet = Fleet([ReplicaConfig("v", "http://127.0.0.1:1")])
    assert not fleet.record_scrape("v", parse_metrics(page.format(n=1000.0)))
    assert fleet.record_scrape("v", parse_metrics(page.format(n=10.0)))
    assert not fleet.record_scrape("v", parse_metrics(page.format(n=20.0)))
    assert fleet.get("v").view().epoch == 1  # type: ignore[union-attr]
