import argparse

from loadtests.cli_demo import DEMO_POLICIES, add_arguments, demo_config, versus_round_robin


def test_the_demo_shows_the_default_policy_against_round_robin() -> None:
    assert DEMO_POLICIES[0] == "round_robin" and "cost" in DEMO_POLICIES
    rr = {"token_hit_rate": 0.1, "prefill_tokens": 1_000_000, "ttft_p95_s": 0.76}
    cost = {"token_hit_rate": 0.62, "prefill_tokens": 420_000, "ttft_p95_s": 0.63}
    line = versus_round_robin("cost", cost, rr)
    assert line == ("cost: 6.2x the cached prompt tokens of round_robin, 580,000 fewer "
                    "prefill tokens, p95 time to first token 0.63 s against 0.76 s.")
    cold = versus_round_robin("cost", cost, dict(rr, token_hit_rate=0.0))
    assert cold.startswith("cost: token hit rate 0.62 of round_robin")


def test_the_demos_engines_publish_kv_events_for_cost_to_read() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = demo_config(parser.parse_args([]))
    assert cfg.kv_events and cfg.policies == DEMO_POLICIES and cfg.eviction == "frequency"
