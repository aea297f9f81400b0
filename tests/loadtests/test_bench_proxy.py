from loadtests.bench_proxy import _prefix_tokenize_ms
from loadtests.gateway_cpu import documents


def test_the_prefix_tokenizing_cost_is_timed_back_to_back_and_spaced() -> None:
    out = _prefix_tokenize_ms(documents(4, words=1500))
    assert set(out) == {"back_to_back", "spaced_10ms"}
    assert all(v > 0 for v in out.values())
