"""The Grafana dashboard's shape (data source as a variable, panels on the grid, only
defined variables) and that every series it reads is one the gateway or the engine
exports (the real Prometheus run is ``tests/e2e/test_prometheus_dashboard.py``)."""

from __future__ import annotations

import re

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine.metrics import EngineMetrics
from gateway.config import parse_config
from gateway.state import build_state
from tests.support.dashboard import load_dashboard, panel_queries, panels, variable_queries
from tests.support.engine_cores import make_core

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
BUILTINS = {"__rate_interval"}
SERIES = re.compile(r"\b((?:vllm:|kvgate[:_]|process_)[a-zA-Z0-9_:]+)")


def test_shape_and_variables() -> None:
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
    every = panels(dashboard)
    assert len({p["id"] for p in every}) == len(every), "panel ids repeat"
    exprs = []
    for panel in every:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["refId"], panel["title"]
            exprs.append(target["expr"])
    for expr in exprs:
        used = set(re.findall(r"\$(\w+)", expr))
        assert used <= set(variables) | BUILTINS, (expr, used)


def test_every_series_read_is_exported() -> None:
    config = parse_config({"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
                           "policy": {"name": "prefix_affinity"}})
    gateway = build_state(config).metrics
    gateway.answers.answered("m", "affinity", 0.1, 0.2, 3)
    engine = EngineMetrics(make_core(), "m")
    exported = {s.name for registry in (gateway.registry, engine.registry)
                for fam in text_string_to_metric_families(generate_latest(registry).decode())
                for s in fam.samples}
    dashboard = load_dashboard()
    exprs = [*panel_queries(dashboard), *variable_queries(dashboard).values()]
    read = {name for expr in exprs for name in SERIES.findall(expr)}
    assert read - exported == set()
    assert {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "kvgate_time_to_first_token_seconds_bucket",
            "vllm:time_to_first_token_seconds_bucket"} <= read
