from loadtests.bench_decision import chat_bodies, main


def test_chat_decisions_are_timed_on_both_paths() -> None:
    out = main(["--variants", "cost", "--words", "200", "--warmup", "5", "--samples", "10",
                "--chat", "10"])
    for key in ("chat", "chat_gateway_path"):
        figures = out[key]["cost"]
        assert 0 < figures["p50_ms"] <= figures["p99_ms"]
        assert figures["cpu_ms_per_decision"] > 0


def test_chat_bodies_carry_the_size_a_client_would_send() -> None:
    bodies = chat_bodies(3)
    assert all(b.raw_bytes is not None and b.raw_bytes > len(b.messages[0]["content"])
               for b in bodies)
