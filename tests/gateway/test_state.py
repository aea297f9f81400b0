"""Metric parsing, hit-rate windows, queue accounting and config validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ReplicaConfig, load_config, parse_config
from gateway.fleet import Fleet, ModelInfo
from gateway.fleet_events import HealthChanged, ReplicaAdded
from gateway.replica_metrics import HitRateWindow, parse_metrics
from gateway.state import build_state
from policies.base import ReplicaRemoved, ReplicaReset
from policies.config import ConfigError
from policies.per_model import PerModel

VLLM = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 250.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",model_name="m"} 1.0
# TYPE kvgate:num_prompt_tokens_waiting gauge
kvgate:num_prompt_tokens_waiting 4096.0
"""

SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.75
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.6
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} 500000.0
"""


def test_parse_vllm_dialect() -> None:
    m = parse_metrics(VLLM)
    assert m.dialect == "vllm"
    assert (m.running, m.waiting, m.kv_usage) == (4, 5, 0.5)
    assert m.kv_capacity_tokens == 16 * 2048
    assert (m.hit_tokens, m.query_tokens, m.queued_tokens) == (250.0, 1000.0, 4096)


def test_parse_sglang_dialect() -> None:
    m = parse_metrics(SGLANG)
    assert m.dialect == "sglang"
    assert (m.running, m.waiting, m.kv_usage) == (7, 2, 0.75)
    assert m.kv_capacity_tokens == 500000 and m.hit_rate_gauge == 0.6
    assert m.hit_tokens is None and m.queued_tokens is None


# vLLM with two data-parallel engines behind one server: one sample per engine
VLLM_TWO_RANKS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.8
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 3000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 400.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 600.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
"""


def test_several_engine_ranks_add_up_and_ratios_average() -> None:
    m = parse_metrics(VLLM_TWO_RANKS)
    assert (m.running, m.waiting) == (8, 1)
    assert m.kv_usage == pytest.approx(0.7)  # not 1.4
    assert m.kv_capacity_tokens == 32_000
    assert (m.hit_tokens, m.query_tokens) == (1000.0, 4000.0)


def test_hit_rate_window_slides_and_survives_resets() -> None:
    w = HitRateWindow(window_s=10)
    assert w.rates().hit_rate is None
    assert not w.add(0, 0, 0)
    assert not w.add(5, 50, 100)
    assert w.rates().hit_rate == 0.5
    assert not w.add(20, 50, 200)  # the window now starts at t=5
    assert w.rates().hit_rate == 0.0
    assert w.add(21, 10, 20)  # counters went back: a restart
    assert w.rates().hit_rate is None
    w.add(22, 30, 40)
    assert w.rates().hit_rate == 1.0


def test_queued_tokens_count_own_pending_plus_others_in_the_gauge() -> None:
    fleet = Fleet([ReplicaConfig("r", "http://127.0.0.1:1")])
    state = fleet.get("r")
    assert state is not None
    early = fleet.sent("r", 100)
    assert state.queued_tokens() == 100  # no scrape yet: the gateway's own count
    fleet.record_scrape("r", parse_metrics(VLLM))  # 4096 queued: 100 ours, 3996 others'
    assert state.queued_tokens() == 4096
    late = fleet.sent("r", 30)
    assert state.queued_tokens() == 4126
    fleet.first_byte(early)  # ours answered: out of the queue at once, not at the next scrape
    assert state.queued_tokens() == 4026
    fleet.first_byte(late)
    fleet.first_byte(late)  # settling twice changes nothing
    assert state.queued_tokens() == 3996
    fleet.done(early)
    fleet.done(late)
    assert state.in_flight == 0 and state.pending_tokens == 0
    # a scrape taken before the replica saw a request just sent (its front end still
    # reading it) reads 0: the request still counts, the replica is not taken for idle
    just_sent = fleet.sent("r", 500)
    fleet.record_scrape("r", parse_metrics(VLLM.replace(
        "kvgate:num_prompt_tokens_waiting 4096", "kvgate:num_prompt_tokens_waiting 0")))
    assert state.queued_tokens() == 500
    fleet.done(just_sent)
    assert state.queued_tokens() == 0


def test_a_view_counts_its_own_requests_in_flight_now_and_others_as_last_scraped() -> None:
    fleet = Fleet([ReplicaConfig("r", "http://127.0.0.1:1")])
    state = fleet.get("r")
    assert state is not None
    ours = [fleet.sent("r", 10) for _ in range(3)]
    fleet.record_scrape("r", parse_metrics(VLLM))  # 4 running, 5 waiting: 3 ours
    view = state.view()
    assert (view.running, view.waiting, view.in_flight, view.others_in_flight) == (4, 5, 3, 6)
    for pending in ours:  # answered: gone at once, not at the next scrape
        fleet.done(pending)
    view = state.view()
    assert (view.running, view.waiting, view.in_flight, view.others_in_flight) == (4, 5, 0, 6)
    fleet.record_scrape("r", parse_metrics(VLLM))  # none of ours there now: all others'
    assert state.view().others_in_flight == 9
    many = [fleet.sent("r", 10) for _ in range(12)]  # more than the gauges show (some
    fleet.record_scrape("r", parse_metrics(VLLM))  # still in the replica's front end)
    assert state.view().others_in_flight == 0 and state.view().in_flight == 12
    for pending in many:
        fleet.done(pending)


def test_a_view_tells_its_scrape_and_the_requests_still_prefilling_then() -> None:
    fleet = Fleet([ReplicaConfig("r", "http://127.0.0.1:1")])
    state = fleet.get("r")
    assert state is not None
    ours = [fleet.sent("r", 10) for _ in range(7)]
    fleet.first_byte(ours[0])  # one decoding; six without a first byte
    fleet.record_scrape("r", parse_metrics(VLLM))  # 4 running, 5 waiting
    view = state.view()
    # six of ours had no first byte, five were waiting: one running was in prefill
    assert (view.scrape_seq, view.prefilling) == (1, 1)
    for pending in ours[1:3]:
        fleet.first_byte(pending)
    assert state.view().prefilling == 1  # as the last scrape saw it
    fleet.record_scrape("r", parse_metrics(VLLM))
    assert (state.view().scrape_seq, state.view().prefilling) == (2, 0)
    for pending in ours:
        fleet.done(pending)


def test_restart_bumps_epoch() -> None:
    fleet = Fleet([ReplicaConfig("r", "http://127.0.0.1:1")])
    assert not fleet.record_scrape("r", parse_metrics(VLLM))
    assert fleet.record_scrape("r", parse_metrics(VLLM.replace("1000.0", "10.0")))
    assert fleet.get("r").view().epoch == 1  # type: ignore[union-attr]


def test_a_view_follows_every_change_of_its_replica() -> None:
    """Views keep the fields that change only with a scrape, health, a restart or the
    token ratio between changes: each change must still show in the next view."""
    fleet = Fleet([ReplicaConfig("r", "http://127.0.0.1:1")])
    state = fleet.get("r")
    assert state is not None
    first = state.view(now=10.0)
    assert (first.running, first.kv_capacity_tokens, first.healthy) == (0, None, True)
    assert state.view(now=10.0) == first
    fleet.record_scrape("r", parse_metrics(VLLM))
    scraped = state.view(now=10.0)
    assert scraped.running > 0 and scraped.kv_capacity_tokens is not None
    assert state.view(now=10.0, ratio=2.0).kv_capacity_tokens == \
        scraped.kv_capacity_tokens // 2
    sent = fleet.sent("r", 50, now=10.0)
    pending = state.view(now=12.5)
    assert (pending.in_flight, pending.pending_age_s) == (1, 2.5)
    assert pending.queued_tokens == scraped.queued_tokens + 50
    fleet.first_byte(sent)
    fleet.done(sent)
    fleet.eject("r", "test")
    assert state.view().healthy is False
    fleet.record_scrape("r", parse_metrics(VLLM.replace("1000.0", "10.0")))  # restarted
    assert state.view().epoch == 1
    fleet.record_scrape("r", parse_metrics(SGLANG))
    assert state.view().token_hit_rate == state.token_hit_rate() is not None
    other = fleet.add(ReplicaConfig("q", "http://127.0.0.1:2"))
    assert other.view().kv_capacity_tokens is None
    other.estimated_kv_replica_tokens = 777  # as the capacity estimator sets it
    assert other.view().kv_capacity_tokens == 777


@pytest.mark.parametrize(("data", "message"), [
    ({"replicas": [{"id": "a", "url": "http://h:1", "wieght": 2}]}, "'wieght'"),
    ({"replicas": [{"id": "a", "url": "localhost:1"}]}, "'localhost:1'"),
    ({"replicas": [{"id": "a", "url": "http://h:1", "weight": -1}]}, "-1"),
    ({"replicas": [{"id": "a", "url": "http://h:1"}, {"id": "a", "url": "http://h:2"}]},
     "appears twice"),
    ({"port": "80"}, "config.port"),
    ({"timeouts": {"idle_s": 0}}, "config.timeouts: idle_s must be at least 0.001 s"),
    ({"health": {"interval": 1}}, "'interval'"),
    ({"port": 99999}, "port must be at most 65535, got 99999"),
    ({"admin": {"port": 70000}}, "port must be at most 65535, got 70000"),
    ({"scrape": {"interval_s": float("nan")}}, "expected a finite number, got nan"),
])
def test_config_errors_name_key_and_value(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_config(data)


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "gw.yaml"
    bad.write_text("replicas: [\n")
    with pytest.raises(ConfigError, match=str(bad)):
        load_config(bad)
    bad.write_text("replicas:\n  - {id: a, url: 'http://h:1'}\nscrape: {interval_s: -2}\n")
    with pytest.raises(ConfigError,
                       match=rf"{bad}.scrape: interval_s must be at least 0.01 s, got -2"):
        load_config(bad)
    bad.write_text("replicas:\n  - {id: a, url: 'http://h:1'}\npolicy: {name: cost, nosuch: 1}\n")
    with pytest.raises(ConfigError, match=rf"{bad}\.policy: unknown key 'nosuch'"):
        load_config(bad)


def test_a_key_written_twice_is_refused_naming_it_and_its_lines(tmp_path: Path) -> None:
    bad = tmp_path / "gw.yaml"
    bad.write_text("port: 8000\nreplicas:\n  - {id: a, url: 'http://h:1'}\nport: 9000\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: line 4: key 'port' appears twice in one "
                                          r"mapping \(first on line 1\)$"):
        load_config(bad)
    bad.write_text("replicas:\n  - {id: a, url: 'http://h:1', id: b}\n")
    with pytest.raises(ConfigError, match=r"line 2: key 'id' appears twice"):
        load_config(bad)
    merged = tmp_path / "merged.yaml"  # a merge key's values may be written over
    merged.write_text("replicas:\n  - &r {id: a, url: 'http://h:1'}\n  - {<<: *r, id: b, url: 'http://h:2'}\n")
    assert [r.id for r in load_config(merged).replicas] == ["a", "b"]


@pytest.mark.parametrize(("text", "said"), [
    ("scrape: {interval_s: 1e300}", "scrape.interval_s: expected a finite number, got the "
     "string '1e300' (YAML reads a number with an exponent as text unless it has a dot and "
     "a signed exponent: write it as 1.0e+300 or as a smaller number)"),
    ("max_body_bytes: 1e7", "max_body_bytes: expected an integer, got the string '1e7' "
     "(YAML reads a number with an exponent as text unless it has a dot and a signed "
     "exponent: write it as 10000000)"),
    ("scrape: {interval_s: '5'}", "got the string '5' (quoted, it is text: write it "
     "without quotes)"),
])
def test_a_number_yaml_read_as_text_says_how_to_write_it(
        tmp_path: Path, text: str, said: str) -> None:
    bad = tmp_path / "gw.yaml"
    bad.write_text(f"replicas:\n  - {{id: a, url: 'http://h:1'}}\n{text}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(bad)
    assert said in str(refused.value)


def test_replica_figures_are_converted_to_gateway_tokens() -> None:
    fleet = Fleet([ReplicaConfig("r", "http://127.0.0.1:1")])
    fleet.record_scrape("r", parse_metrics(VLLM), now=0.0)
    fleet.record_scrape("r", parse_metrics(VLLM.replace("1000.0", "1600.0")), now=2.0)
    pending = fleet.sent("r", 100, now=5.0)
    assert fleet.views(now=5.0)[0].kv_capacity_tokens == 2048 * 16  # no answers yet: 1:1
    for _ in range(fleet.calibration.min_samples):  # the replica counts half our tokens
        fleet.calibration.observe(None, 500, 1000)
    assert fleet.calibration.ratio() == pytest.approx(0.5)
    view = fleet.views(now=6.5)[0]
    assert view.kv_capacity_tokens == 2 * 2048 * 16
    assert view.queued_tokens == 2 * 4096 + 100  # the gauge is the replica's; ours is ours
    assert view.prefill_tokens_per_s == pytest.approx(2 * 600 / 2)
    assert view.pending_age_s == pytest.approx(1.5)
    fleet.first_byte(pending)
    assert fleet.views(now=7.0)[0].pending_age_s == 0.0
    assert fleet.calibration.to_gateway(300) == 600


def test_calibration_is_per_model_and_bounded() -> None:
    fleet = Fleet([])
    cal = fleet.calibration
    for _ in range(cal.min_samples):
        cal.observe("a", 300, 100)
        cal.observe("b", 100, 100)
    assert cal.ratio("a") == pytest.approx(3.0)
    assert cal.ratio("b") == pytest.approx(1.0)
    assert cal.ratio("unseen") == pytest.approx(2.0)  # the mean over what is known
    for i in range(cal.max_models + 10):
        cal.observe(f"m{i}", 1, 1)
    assert len(cal.snapshot()) <= cal.max_models
    # one absurd usage figure is not believed (2**53 tokens moved the ratio 1e12-fold)
    cal.observe("a", 2**53, 100)
    cal.observe("a", 1, 10_000)
    assert cal.ratio("a") == pytest.approx(3.0)


def test_a_replica_without_capacity_gauges_takes_the_configured_one() -> None:
    fleet = Fleet([ReplicaConfig("r", "http://127.0.0.1:1", kv_capacity_tokens=12_000)])
    assert fleet.views()[0].kv_capacity_tokens == 12_000
    with pytest.raises(ConfigError, match="kv_capacity_tokens"):
        parse_config({"replicas": [{"id": "r", "url": "http://x:1", "kv_capacity_tokens": 0}]})


def test_the_fleet_tells_its_listeners() -> None:
    fleet = Fleet([ReplicaConfig(id="a", url="http://a")])
    heard: list[object] = []
    fleet.listen(heard.append)
    fleet.add(ReplicaConfig(id="b", url="http://b"))
    assert fleet.record_health("b", False, "down", 1, 1) is False
    assert fleet.record_health("b", True, None, 1, 1) is True
    fleet.record_scrape("a", parse_metrics(VLLM))
    assert fleet.record_scrape("a", parse_metrics(VLLM.replace("1000.0", "10.0")))
    fleet.remove("b")
    fleet.unlisten(heard.append)
    fleet.remove("a")
    assert heard == [ReplicaAdded("b"), HealthChanged("b", False), HealthChanged("b", True),
                     ReplicaReset("a"), ReplicaRemoved("b")]


def test_a_config_without_a_policy_routes_with_cost() -> None:
    from policies.cost import Cost
    from policies.registry import build_policy

    cfg = parse_config({"replicas": [{"id": "r", "url": "http://x:1"}]})
    assert cfg.policy == {"name": "cost"}
    assert isinstance(build_policy(cfg.policy), Cost)


def test_a_weight_is_a_bounded_share() -> None:
    # weight 2000 built a ring of 512,000 points on the event loop: 6 s of a frozen gateway
    with pytest.raises(ConfigError, match="weight must be > 0 and at most 100"):
        parse_config({"replicas": [{"id": "r", "url": "http://x:1", "weight": 2000}]})
    assert parse_config({"replicas": [{"id": "r", "url": "http://x:1", "weight": 100}]})


def test_a_gateway_keeps_a_model_state_from_before_the_model_lists_came() -> None:
    """Before any replica's model list is known every name has a state of its own (as
    without lists); once the lists come, a listed model keeps it, an unlisted name gets
    the shared one."""
    config = parse_config({"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
                           "policy": {"name": "cost"}})
    state = build_state(config)
    policy = state.policy
    assert isinstance(policy, PerModel)
    early = policy.policy_for("llama")  # no list known yet
    assert early is not policy.policy_for(None)
    replica = state.fleet.get("r0")
    assert replica is not None
    replica.model_info = {"llama": ModelInfo()}  # the replica's list arrives
    assert policy.policy_for("llama") is early
    assert policy.policy_for("made-up") is policy.policy_for(None)
