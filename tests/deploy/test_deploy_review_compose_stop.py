"""``docker compose stop`` (and ``down``, a restart) gives the gateway time to drain: compose
sends SIGTERM, then SIGKILL after the service's ``stop_grace_period`` (10 s when unset),
and the gateway takes up to its ``shutdown.timeout_s`` (30 s by default) to answer what it
has in flight. Killed before, the streams it relays end with no error marking them cut."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gateway.config import load_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE_DEFAULT_S = 10.0  # docker's stop timeout when the service names none
DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(text: str) -> float:
    """A compose duration (Go's time.ParseDuration: ``40s``, ``1m30s``) in seconds."""
    parts = DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(n) * UNIT_S[u] for n, u in parts)


def test_duration_s() -> None:
    assert duration_s("40s") == 40.0
    assert duration_s("1m30s") == 90.0
    assert duration_s("1500ms") == 1.5
    with pytest.raises(AssertionError):
        duration_s("40")


def test_gateway_is_given_its_shutdown_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "")  # as compose passes it unset
    monkeypatch.setenv("KVGATE_ENGINE_API_KEY", "")  # (the engines' key, likewise)
    gateway = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]["gateway"]
    mount = next(v for v in gateway["volumes"] if v.endswith(":/etc/kvgate/gateway.yaml:ro"))
    config = load_config(DEPLOY / mount.split(":")[0])
    stop_s = duration_s(gateway["stop_grace_period"]) if "stop_grace_period" in gateway \
        else COMPOSE_DEFAULT_S
    assert stop_s > config.shutdown.timeout_s, \
        f"compose kills the gateway {stop_s:g} s after SIGTERM; it drains for up to " \
        f"{config.shutdown.timeout_s:g} s"
