from loadtests.bench_policies import main


def test_the_policy_benchmark_times_choices_memory_and_views() -> None:
    out = main(["--quick", "--replicas", "4", "--policies", "cost", "round_robin",
                "--documents", "40", "--doc-tokens", "600", "--long-tokens", "3000"])
    for name in ("cost", "round_robin"):
        assert 0 < out[name]["4"]["p50_us"] <= out[name]["4"]["p99_us"]
        assert out[name]["4"]["observe_p50_us"] >= 0
    assert out["cost"]["4"]["observe_p50_us"] > 0  # it admits the prompt into its models
    assert out["cost_memory_mb"] > 0
    assert out["gateway_views_us"]["4"] > 0
    long = out["cost_long_prompt"]
    assert long["tokens"] == 3000 and long["choose_p50_us"] > 0 and long["observe_p50_us"] > 0
    ring = out["ring_join_ms"]["4"]
    assert ring["cost"]["vnodes"] == 256 and ring["prefix_affinity"]["vnodes"] == 1024
    assert ring["cost"]["first_build_ms"] > 0 and ring["cost"]["one_joins_ms"] > 0
