"""A request that falls due once the run's time is up is not the run's: a client that drew
it before the end does not send it while the run's clients drain (only free clients held
one, so a policy that kept its clients free got extra requests in its figures)."""

from __future__ import annotations

from pathlib import Path

from tests.loadtests.test_locustfile import _ANSWERS, _locust_samples, _replica


def test_no_request_due_after_the_runs_end_is_sent(tmp_path: Path) -> None:
    with _replica(0.0, False, _ANSWERS["stream"]) as port:
        samples = _locust_samples(tmp_path, f"http://127.0.0.1:{port}", users=30, rate=10)
    sent = [s for s in samples if not s.get("unsent")]
    assert sent and all(s["ok"] for s in sent)
    # a 2 s run: every request sent fell due within it (spawning takes a moment more)
    assert max(s["due_s"] for s in sent) < 2.25
