"""``loadtests.run``'s figures from a real headless Locust run, against a backend that
answers some requests whole, cuts some short and holds others past the run's end (the
fleet and the engines' counters stood in for): an answer cut short or aborted counts as
failed, with its reason; a request unanswered at the end counts in the TTFT figures (at
how long it had waited, where no first token came: a lower bound, ``ttft_censored``), as
does a failed one (at how long it had waited when the run stopped); a duration Locust
cannot run is refused."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import pytest

from loadtests import cli_demo, engine_counters
from loadtests import run as load_run
from tests.loadtests.answer_modes import answer_modes


class _Fleet:
    """A fleet of one: the backend stands for its gateway; no engines to scrape."""

    def __init__(self, url: str) -> None:
        self.gateway_urls = [url]
        self.engine_urls: list[str] = []
        self.replicas: list[dict[str, Any]] = []

    def __enter__(self) -> _Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def backend_fleet(serve, monkeypatch) -> Iterator[None]:
    # 4 users: each answered twice, cut short once, refused by an aborting engine once,
    # then held past the run's end (with no first token, or with one), 1 s after it
    server = serve(answer_modes(["whole", "truncated", "whole", "abort",
                                 "hold_first", "hold_after_first"], served_by="r0"))
    monkeypatch.setattr(load_run, "LocalFleet", lambda spec, workdir: _Fleet(server.url))
    monkeypatch.setattr(engine_counters, "scrape", lambda url: {})
    monkeypatch.setattr(load_run, "STOP_TIMEOUT_S", 1)
    monkeypatch.setattr(load_run, "STREAM_REQUESTS", 300)
    yield


def test_cut_short_answers_fail_and_unanswered_requests_count_in_ttft(tmp_path,
                                                                       backend_fleet):
    cfg = load_run.RunConfig(policies=("round_robin",), duration_s=2, replicas=1, users=4,
                             rate=20.0, workload={"num_docs": 4, "hot_docs": 1,
                                                  "doc_tokens": 50})
    out = load_run.run(cfg, tmp_path / "report", tmp_path / "out.json")
    r = out["policies"]["round_robin"]
    # two turns of the backend's six ways, then every user waits on a held request
    assert (r["requests_ok"], r["requests_failed"], r["requests_unfinished"]) == (4, 4, 4)
    assert r["failures"] == {"stream ended without [DONE] (cut short)": 2,
                             "finish_reason abort": 2}
    # ~40 fell due in the 2 s: those due once every user waited on a held one were never
    # sent, and count too (in TTFT at their wait so far, not as failures)
    unsent = r["requests_unsent"]
    assert unsent >= 10
    assert r["send_late_s"]["p99"] > 0.5
    # every request is timed: the answered ones, the held ones with their first token,
    # those held without one or never sent at their wait so far, and the failed ones at
    # how long they had waited when the run stopped (as never answered)
    assert r["ttft_censored"] == 2 + unsent + 4
    # p95 and p99 fall on the held, unsent and failed requests' lower bounds (the answers
    # took ~10 ms)
    assert 1.0 <= r["ttft_p95_s"] <= r["ttft_p99_s"]
    written = json.loads((tmp_path / "out.json").read_text())["policies"]["round_robin"]
    assert written["ttft_censored"] == 2 + unsent + 4
    assert written["ttft_p95_s"] == r["ttft_p95_s"]
    report = (tmp_path / "report" / "report.md").read_text()
    assert (f"4 unanswered at the end; {unsent} due but never sent: every client was busy; "
            f"4 failed; {2 + unsent + 4} without a first token or a whole answer") in report
    assert "a lower bound" in report


@pytest.mark.parametrize("text", ["0.5", "0", "0.99", "nan", "inf", "-2"])
def test_a_duration_locust_cannot_run_is_refused_when_parsed(text, capsys):
    for module in (load_run, cli_demo):
        parser = argparse.ArgumentParser(prog="kvgate")
        module.add_arguments(parser)
        with pytest.raises(SystemExit):
            parser.parse_args(["--duration", text])
        err = capsys.readouterr().err
        assert "argument --duration: must be a number of seconds >= 1" in err
        assert f"got {text}" in err
    with pytest.raises(ValueError, match=r"got 0\.5"):  # a config made in code: before a fleet
        load_run.run(load_run.RunConfig(duration_s=0.5), None, None)


@pytest.mark.parametrize(("seconds", "run_time"),
                         [(1, "1s"), (1.4, "1s"), (1.5, "2s"), (20.9, "21s"), (120, "120s")])
def test_locust_runs_the_nearest_whole_second(seconds, run_time):
    assert load_run.locust_run_time(seconds) == run_time
    parser = argparse.ArgumentParser()
    load_run.add_arguments(parser)
    args = parser.parse_args(["--duration", str(seconds)])
    assert args.duration == float(run_time[:-1])  # the config says what Locust runs
    assert load_run.config_from_args(args).duration_s == float(run_time[:-1])
