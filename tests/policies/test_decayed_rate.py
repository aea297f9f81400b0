import pytest

from policies.pace import DecayedRate


@pytest.mark.parametrize("seconds", [5, 30, 60, 600])
def test_a_steady_rate_reads_as_itself_from_the_start(seconds: int) -> None:
    rate = DecayedRate(60.0)
    for t in range(seconds * 10):
        rate.add(t / 10, 10.0)  # 100 tokens a second
    assert rate.rate(seconds) == pytest.approx(100.0, rel=0.1)


def test_a_rate_decays_once_the_tokens_stop() -> None:
    rate = DecayedRate(60.0)
    for t in range(6000):
        rate.add(t / 10, 10.0)
    assert rate.rate(600 + 60) == pytest.approx(100.0 / 2.718, rel=0.1)
    assert DecayedRate(1.0).rate(5.0) == 0.0
