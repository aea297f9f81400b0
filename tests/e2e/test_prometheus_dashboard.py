"""A real Prometheus scrapes a local sim fleet and its gateway while the official client
drives traffic through the gateway; then every query of the Grafana dashboard
(``deploy/grafana/kvgate.json``) runs against Prometheus' HTTP API and returns data."""

from __future__ import annotations

import re
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest

from tests.support.dashboard import load_dashboard, panel_queries, variable_queries
from tests.support.fleets import start_fleet
from tests.support.processes import Processes
from tests.support.prometheus import BINARY, Prometheus

# what Grafana would put in place of the template variables: all replicas and models, a
# rate window of several scrapes
VARIABLES = {"$__rate_interval": "30s", "$replica": ".*", "$model": ".*"}

pytestmark = pytest.mark.skipif(
    BINARY is None, reason="the prometheus binary is not installed (Debian package "
    "'prometheus'; .ci/run installs it)")


def substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a template variable left in {expr!r}"
    return expr


def _traffic(gateway: str, seconds: float) -> int:
    """Mixed requests for ``seconds``: streamed chat with and without usage, non-streamed
    completions; the same few documents again and again (prefix hits)."""
    client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0,
                           timeout=30)
    docs = [f"Contract {d}: " + " ".join(f"clause {i} binds party {d}." for i in range(60))
            for d in range(3)]
    sent, end = 0, time.monotonic() + seconds
    while time.monotonic() < end or sent < 6:
        doc = docs[sent % len(docs)]
        kind = sent % 3
        if kind == 0:
            chunks = list(client.chat.completions.create(
                model="sim-llama", messages=[{"role": "user", "content": doc}],
                max_tokens=4, stream=True))
            assert chunks
        elif kind == 1:
            chunks = list(client.completions.create(
                model="sim-llama", prompt=doc, max_tokens=4, stream=True,
                stream_options={"include_usage": True}))
            assert chunks[-1].usage is not None
        else:
            out = client.completions.create(model="sim-llama", prompt=doc, max_tokens=4)
            assert out.usage is not None
        sent += 1
    client.close()
    return sent


def test_every_dashboard_query_returns_data(spawn: Processes, tmp_path: Path) -> None:
    dashboard = load_dashboard()
    queries = panel_queries(dashboard)
    assert len(queries) >= 15
    fleet = start_fleet(spawn, tmp_path, {"name": "prefix_affinity", "prefix_tokens": 64})
    prom = Prometheus(tmp_path, {
        "kvgate-gateway": [urlsplit(fleet.gateway).netloc],
        "kvgate-replicas": [urlsplit(url).netloc for url in fleet.urls]})
    try:
        prom.wait_scraped({"kvgate-gateway", "kvgate-replicas"})
        assert _traffic(fleet.gateway, 2.0) >= 6
        # the template variables' own queries (label_values(metric, label))
        for name, query in variable_queries(dashboard).items():
            found = re.fullmatch(r"label_values\((\S+), (\w+)\)", query)
            assert found is not None, (name, query)
            metric, label = found.groups()
            assert prom.api(f"label/{label}/values", **{"match[]": metric}), name
        missing = [q for q in queries if not prom.finite(substituted(q))]
        deadline = time.monotonic() + 20  # the last scrapes after the traffic
        while missing and time.monotonic() < deadline:
            time.sleep(0.5)
            missing = [q for q in missing if not prom.finite(substituted(q))]
        assert missing == [], "dashboard queries without data"
        # and the data is the fleet's: a token hit rate in (0, 1] from repeated documents
        rate = prom.finite(substituted(queries[0]))
        assert all(0 < v <= 1 for v in rate), rate
    finally:
        prom.stop()
