"""The Grafana dashboard in ``deploy/grafana``: its panels and the queries they run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kvgate.json"


def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, the panels nested in rows included."""
    out, stack = [], list(dashboard["panels"])
    while stack:
        panel = stack.pop(0)
        out.append(panel)
        stack.extend(panel.get("panels", []))
    return out


def panel_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every target's ``expr``, in panel order."""
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", []) if t.get("expr")]


def variable_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """The query of each query variable, by name (``label_values(metric, label)``)."""
    return {v["name"]: v["query"]["query"] for v in dashboard["templating"]["list"]
            if v["type"] == "query"}
