"""An empty ``api_key_env`` variable is no key (deploy/docs: an empty
``KVGATE_ENGINE_API_KEY`` sends none), so start-up does not warn that the replica is sent
its key over plain http://; a key the variable holds, or a key file, still is."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import serve as serve_cli
from gateway.config import load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_GATEWAY = ROOT / "deploy" / "gateway" / "compose-gateway.yaml"
VAR = "KVGATE_ENGINE_API_KEY"


@pytest.fixture(autouse=True)
def _no_admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "")  # as compose passes it unset: admin off


def test_the_compose_config_with_the_key_empty_warns_of_no_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VAR, "")
    config = load_config(COMPOSE_GATEWAY)
    assert all(r.api_key_env == VAR and r.url.startswith("http://") for r in config.replicas)
    assert [r.resolved_api_key() for r in config.replicas] == [None, None, None]
    assert serve_cli.exposed_secrets(config) == []
    monkeypatch.setenv(VAR, "  \n")  # whitespace only: empty once stripped, as it is read
    assert serve_cli.exposed_secrets(config) == []


def test_a_key_in_the_variable_or_a_key_file_is_still_warned_of(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(VAR, "key-0123456789abcdef0123")
    config = load_config(COMPOSE_GATEWAY)
    assert serve_cli.exposed_secrets(config) == [
        f"replicas[{i}] (engine-{i}) is sent its API key over plain http:// to engine-{i}, "
        "readable on the network: use https:// or a private network" for i in range(3)]
    empty = tmp_path / "r0.key"  # a file may hold a key once rewritten: warned of
    empty.write_text("")
    empty.chmod(0o600)
    assert serve_cli.exposed_secrets(parse_config({"replicas": [
        {"id": "r0", "url": "http://10.0.0.7:8000", "api_key_file": str(empty)}]})) == [
        "replicas[0] (r0) is sent its API key over plain http:// to 10.0.0.7, readable on "
        "the network: use https:// or a private network"]
