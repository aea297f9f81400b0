from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.replica_metrics import ScrapedMetrics, stale_copy


def scrape(hits: float, queries: float) -> ScrapedMetrics:
    return ScrapedMetrics("vllm", running=1, hit_tokens=hits, query_tokens=queries)


def test_a_replica_whose_scrapes_stopped_has_no_prefill_rate_until_two_fresh_ones() -> None:
    # its /metrics failed stale_after_failures times in a row: the monitor records the
    # stale copy; the prefill rate and hit rate learned before must go with the load
    # figures, or routing (cost's cache aging, the 429's Retry-After) trusts them for good
    fleet = Fleet([ReplicaConfig(id="r", url="http://127.0.0.1:1")])
    state = fleet.get("r")
    assert state is not None
    fleet.record_scrape("r", scrape(0, 0), now=0.0)
    last = scrape(1_000, 5_000)
    fleet.record_scrape("r", last, now=10.0)
    view = fleet.views()[0]
    assert (view.prefill_tokens_per_s, view.token_hit_rate) == (400.0, 0.2)
    fleet.record_scrape("r", stale_copy(last), now=13.0)
    view = fleet.views()[0]
    assert (view.prefill_tokens_per_s, view.token_hit_rate) == (None, None)
    assert state.hits.prefill_per_s() is None
    # back: one fresh sample tells no rate, two do (over their span only)
    assert not fleet.record_scrape("r", scrape(1_500, 7_000), now=60.0)
    assert fleet.views()[0].prefill_tokens_per_s is None
    fleet.record_scrape("r", scrape(1_600, 7_500), now=61.0)
    assert fleet.views()[0].prefill_tokens_per_s == 400.0


def test_a_restart_while_its_scrapes_were_stale_is_still_noticed() -> None:
    fleet = Fleet([ReplicaConfig(id="r", url="http://127.0.0.1:1")])
    fleet.record_scrape("r", scrape(1_000, 5_000), now=0.0)
    fleet.record_scrape("r", stale_copy(scrape(1_000, 5_000)), now=3.0)
    epoch = fleet.views()[0].epoch
    assert fleet.record_scrape("r", scrape(10, 50), now=9.0)  # its counters went back
    assert fleet.views()[0].epoch == epoch + 1
