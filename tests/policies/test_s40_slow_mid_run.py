"""A replica that turns slow mid-run (a device throttled or degraded) is judged slow after
about ``REPLICA_WINDOW`` of its samples, not after most of the fleet's 256-sample window:
its own pace is the low percentile of its last 64 (updated every 32)."""

from __future__ import annotations

from policies.pace import REPLICA_WINDOW, PrefillPace, ReplicaSlowdown

PRIOR_S = 1e-4  # seconds per prefilled token


def _samples_until_slow(slow_at: int) -> int:
    """Samples of r1, each of 1,000 uncached tokens, after it turned twice as slow as r0
    (the fleet's pace learned from both), until it is judged slow."""
    fleet = PrefillPace(PRIOR_S)
    slowdown = ReplicaSlowdown(PRIOR_S, ratio=1.5)
    for i in range(slow_at + 1000):
        for replica, factor in (("r0", 1.0), ("r1", 2.0 if i >= slow_at else 1.0)):
            ttft = factor * PRIOR_S * 1000 * (1.0 + 0.1 * (i % 7) / 7)  # some queueing
            fleet.observe(ttft, 1000)
            slowdown.observe(replica, ttft, 1000, fleet)
        if slowdown.slow().get("r1", 1.0) > 1.0:
            assert slowdown.slow().get("r0", 1.0) == 1.0
            return i - slow_at + 1
    raise AssertionError("r1 was never judged slow")


def test_a_replica_that_turns_slow_is_judged_so_within_its_own_window() -> None:
    # past 80% of its window slow, at the next of its paces' updates (every 32 samples);
    # over the fleet's 256 it took over 200
    for slow_at in (500, 516, 530):
        after = _samples_until_slow(slow_at)
        assert after <= 0.8 * REPLICA_WINDOW + 32, (slow_at, after)


def test_a_replica_slow_from_the_start_is_judged_so_once_it_has_enough_samples() -> None:
    assert _samples_until_slow(0) == 32  # (``min_samples``)
