"""A local fleet's engines run without the caller's engine API key: an exported
``KVGATE_ENGINE_API_KEY`` (for compose) is not the fleet's, whose gateway sends its
replicas none and whose engine URLs are called as they are."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.api_key import API_KEY_ENV
from loadtests.local_fleet import LocalFleet, LocalFleetSpec

MODEL = "fleet-model"


def _status(url: str, body: dict[str, object] | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_fleet_serves_while_the_engine_key_is_exported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "exported-for-compose-0123456789")
    fleet = LocalFleet(LocalFleetSpec(replicas=1, kv_cache_gib=0.5,
                                      engine_args=("--model-name", MODEL)), tmp_path / "fleet")
    try:
        fleet.start()
        # the gateway's request reaches the engine, which asks for no key
        completion = {"model": MODEL, "prompt": "the parties agree", "max_tokens": 2}
        assert _status(f"{fleet.gateway_url}/v1/completions", completion) == 200
        # and so does a call to the engine's own URL
        assert _status(f"{fleet.engine_urls[0]}/v1/completions", completion) == 200
    finally:
        fleet.stop()
