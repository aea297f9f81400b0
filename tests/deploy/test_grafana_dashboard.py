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
    exported = {s.name for registry in (gateway.exposed, engine.registry)
                for fam in text_string_to_metric_families(generate_latest(registry).decode())
                for s in fam.samples}
    dashboard = load_dashboard()
    exprs = [*panel_queries(dashboard), *variable_queries(dashboard).values()]
    read = {name for expr in exprs for name in SERIES.findall(expr)}
    assert read - exported == set()
    assert {"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
            "kvgate_time_to_first_token_seconds_bucket",
            "vllm:time_to_first_token_seconds_bucket"} <= read


# per-replica gauges that every gateway copy reports whole (the replica's queue as routing
# sees it, peers included; its health; its hit rate from its own counters): N copies report
# the same value N times, so across copies take one (max, min, avg), never their sum.
# kvgate_replica_in_flight is each copy's own share and sums rightly.
WHOLE_REPLICA_GAUGES = ("kvgate_replica_queued_tokens", "kvgate_replica_healthy",
                        "kvgate_replica_token_hit_rate", "kvgate_fleet_token_hit_rate")
# aggregations whose result does not change when a series is repeated
UNCHANGED_BY_COPIES = {"max", "min", "avg", "group", "topk", "bottomk", "quantile"}
AGGREGATIONS = UNCHANGED_BY_COPIES | {"sum", "count", "count_values", "stddev", "stdvar"}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
WORD_BEFORE = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*$")


def enclosing_calls(expr: str, at: int) -> list[str]:
    """The names before the parentheses around ``expr[at]``, innermost first (an
    aggregation's ``by (...)``/``without (...)`` clause skipped; "" for bare parentheses)."""
    expr = STRING.sub(lambda m: '"' + "_" * (len(m.group()) - 2) + '"', expr)
    names, depth, i = [], 0, at
    while i > 0:
        i -= 1
        if expr[i] == ")":
            depth += 1
        elif expr[i] == "(" and depth:
            depth -= 1
        elif expr[i] == "(":
            head = expr[:i].rstrip()
            if head.endswith(")"):  # sum by (replica)(...): skip the clause
                close, inner = len(head) - 1, 0
                for j in range(close, -1, -1):
                    inner += {")": 1, "(": -1}.get(head[j], 0)
                    if inner == 0:
                        break
                clause = WORD_BEFORE.search(head[:j])
                if clause and clause.group(1) in ("by", "without"):
                    head = head[:clause.start()]
            word = WORD_BEFORE.search(head)
            names.append(word.group(1) if word else "")
    return names


def test_whole_replica_gauges_are_never_summed_across_copies() -> None:
    dashboard = load_dashboard()
    exprs = [*panel_queries(dashboard), *variable_queries(dashboard).values()]
    read = 0
    for expr in exprs:
        for gauge in WHOLE_REPLICA_GAUGES:
            for match in re.finditer(rf"\b{gauge}\b", expr):
                read += 1
                aggregations = [n for n in enclosing_calls(expr, match.start())
                                if n in AGGREGATIONS]
                if aggregations:  # the innermost one combines the copies' series
                    assert aggregations[0] in UNCHANGED_BY_COPIES, \
                        f"{aggregations[0]} over {gauge} counts it once per gateway copy: {expr}"
    assert read, "the dashboard reads none of the whole-replica gauges"


def test_enclosing_calls() -> None:
    expr = 'max by (replica)(kvgate_replica_queued_tokens{a=~"(x)"})'
    assert enclosing_calls(expr, expr.index("kvgate_")) == ["max"]
    expr = "sum(rate(x[1m])) by (replica) / sum without (pod)((kvgate_replica_healthy))"
    assert enclosing_calls(expr, expr.index("kvgate_")) == ["", "sum"]
    assert enclosing_calls(expr, expr.index("x[")) == ["rate", "sum"]
