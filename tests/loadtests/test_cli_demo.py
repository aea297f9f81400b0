import argparse

from loadtests.cli_demo import DEMO_POLICIES, add_arguments, demo_config, versus_round_robin


def test_the_demo_shows_the_default_policy_against_round_robin() -> None:
    assert DEMO_POLICIES[0] == "round_robin" and "cost" in DEMO_POLICIES
    rr = {"token_hit_rate": 0.1, "prefill_tokens": 1_000_000, "prompt_tokens": 1_111_111,
          "ttft_p95_s": 0.76}
    cost = {"token_hit_rate": 0.62, "prefill_tokens": 420_000, "prompt_tokens": 1_105_263,
            "ttft_p95_s": 0.63}
    line = versus_round_robin("cost", cost, rr)
    assert line == ("cost: 6.2x the cached prompt tokens of round_robin, 574,737 fewer "
                    "prefill tokens on its 1,105,263 prompt tokens, p95 time to first token "
                    "0.63 s against 0.76 s.")
    cold = versus_round_robin("cost", cost, dict(rr, token_hit_rate=0.0))
    assert cold.startswith("cost: token hit rate 0.62 against round_robin's 0.00, ")
    # a run whose engines counted no cache lookup has no rate (None), not a rate of 0
    unmeasured = versus_round_robin("cost", cost, dict(rr, token_hit_rate=None))
    assert unmeasured.startswith("cost: token hit rate 0.62 against round_robin's not "
                                 "measured, ")
    mine = versus_round_robin("cost", dict(cost, token_hit_rate=None), rr)
    assert mine.startswith("cost: token hit rate not measured (its engines counted no "
                           "cache lookup), 574,737 fewer")


def test_the_prefill_saved_is_taken_on_as_many_prompt_tokens_and_no_ttft_is_shown_as_such():
    # a run whose clients, all waiting, sent half the requests: it computed fewer prefill
    # tokens for being sent fewer prompts, not for hitting more
    rr = {"token_hit_rate": 0.1, "prefill_tokens": 900_000, "prompt_tokens": 1_000_000,
          "ttft_p95_s": 0.76}
    half = {"token_hit_rate": 0.5, "prefill_tokens": 250_000, "prompt_tokens": 500_000,
            "ttft_p95_s": None}  # every request failed: none timed
    line = versus_round_robin("other", half, rr)
    assert "200,000 fewer prefill tokens on its 500,000 prompt tokens" in line
    assert line.endswith("p95 time to first token - against 0.76 s.")


def test_the_demos_engines_publish_kv_events_for_cost_to_read() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = demo_config(parser.parse_args([]))
    assert cfg.kv_events and cfg.policies == DEMO_POLICIES and cfg.eviction == "frequency"
