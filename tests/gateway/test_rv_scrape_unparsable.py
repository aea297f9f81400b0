"""A replica whose /metrics answers 200 with something that is no Prometheus text (an
HTML page from a proxy in front of it, minified onto one line) is told once a run of
failures, not at every scrape, and never with the page's text whole."""

from __future__ import annotations

import logging

import httpx
import pytest

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until

PAGE = b"<!DOCTYPE html><html><body>" + b"<div>sign in</div>" * 20_000 + b"</body></html>\n"


def test_an_html_metrics_page_is_told_once_a_run_and_cut_short(
        serve: Serve, caplog: pytest.LogCaptureFixture) -> None:
    replica = Behaviour("a", metrics_extra=PAGE)
    with caplog.at_level(logging.DEBUG, logger="kvgate"):
        gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)],
                           scrape={"interval_s": 0.05})
        wait_until(lambda: sum("unparsable /metrics" in r.getMessage()
                               for r in caplog.records) >= 5, 10, "five failed scrapes")
    told = [r for r in caplog.records if "unparsable /metrics" in r.getMessage()]
    assert told[0].levelno == logging.WARNING
    assert {r.levelno for r in told[1:]} == {logging.DEBUG}
    assert max(len(r.getMessage()) for r in told) < 1024
    assert httpx.get(f"{gw.url}/health").status_code == 200
