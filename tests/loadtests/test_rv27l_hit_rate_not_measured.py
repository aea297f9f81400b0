"""A load run whose engines counted no prefix-cache lookup has no token hit rate (null, '-'
in the report), not a rate of 0: a real sim engine's /metrics scraped around the run."""

import pytest

from loadtests import engine_counters
from loadtests.report import table, write_report
from loadtests.run import RunConfig
from tests.support.engine_servers import LiveEngine, serve_engine

MODEL = "m"


@pytest.fixture
def engine():
    yield from serve_engine(LiveEngine, MODEL)


def _result(counters: engine_counters.FleetCounters) -> dict:
    return {"token_hit_rate": counters.token_hit_rate,
            "prefill_tokens": counters.prefill_tokens, "requests_ok": 0,
            "requests_failed": 3, "ttft_p50_s": None, "ttft_p95_s": None,
            "ttft_p99_s": None, "e2e_p50_s": None, "replica_requests": [0],
            "replica_prefill_tokens": [counters.prefill_tokens], "ttft_s": [0.5]}


def test_rv27l_nothing_looked_up_is_not_measured_and_the_report_says_so(engine, tmp_path):
    before = [engine_counters.scrape(engine.url)]
    idle = engine_counters.deltas(before, [engine_counters.scrape(engine.url)])
    assert idle.total("queries") == 0
    assert idle.token_hit_rate is None

    # once a request reached the engine, its lookups give a rate (0 here: a cold cache)
    engine.stream("/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                                           "messages": [{"role": "user", "content": "hi"}]})
    served = engine_counters.deltas(before, [engine_counters.scrape(engine.url)])
    assert served.total("queries") > 0
    assert served.token_hit_rate == 0.0

    results = {"round_robin": _result(idle), "cost": _result(served)}
    rows = table(results).splitlines()
    assert rows[2].split(" | ")[1] == "-"  # round_robin: not measured
    assert rows[3].split(" | ")[1] == "0.000"
    path = write_report(tmp_path, RunConfig(policies=("round_robin", "cost"), replicas=1),
                        results)
    assert "- cost: token hit rate 0.000 (round_robin's not measured)" in path.read_text()
    # the plot beside it is drawn with the rate left out (no bar), not failed on
    assert (tmp_path / "hit_rate_ttft.png").stat().st_size > 0
    results = {"round_robin": _result(served), "cost": _result(idle)}
    path = write_report(tmp_path, RunConfig(policies=("round_robin", "cost"), replicas=1),
                        results)
    assert "- cost: token hit rate not measured\n" in path.read_text()
