"""The compose file opens nothing by default: ports published on the host's loopback only,
the engines not at all, and the admin API off until ``KVGATE_ADMIN_TOKEN`` is set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import GatewayConfig, load_config
from tests.deploy.builds import dockerfile_builds

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _services() -> dict[str, Any]:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert isinstance(services, dict) and "gateway" in services
    return services


def _gateway_config() -> GatewayConfig:
    mount = next(v for v in _services()["gateway"]["volumes"] if "gateway.yaml" in v)
    return load_config(DEPLOY / mount.split(":")[0])


def test_ports_are_published_on_loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "")
    monkeypatch.setenv("KVGATE_ENGINE_API_KEY", "")  # as compose passes both when unset
    services = _services()
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)
        if name.startswith("engine-"):
            assert "ports" not in svc, f"{name} is published"
    published = {int(p.split(":")[2]) for p in services["gateway"]["ports"]}
    config = _gateway_config()
    assert published == {config.port, config.admin.port}


def test_admin_token_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = _services()["gateway"]
    assert gateway["environment"]["KVGATE_ADMIN_TOKEN"] == "${KVGATE_ADMIN_TOKEN:-}"
    raw = yaml.safe_load((DEPLOY / "gateway" / "compose-gateway.yaml").read_text())
    assert "token" not in raw["admin"] and "token_file" not in raw["admin"]
    assert raw["admin"]["token_env"] == "KVGATE_ADMIN_TOKEN"
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "")  # what compose passes when it is unset
    monkeypatch.setenv("KVGATE_ENGINE_API_KEY", "")  # (the engines' key, likewise)
    assert _gateway_config().admin.resolved_token() is None  # the admin API is off
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "a-token-of-24-characters")
    assert _gateway_config().admin.resolved_token() == "a-token-of-24-characters"
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "short")
    with pytest.raises(ValueError, match="at least 16 characters"):
        _gateway_config()


def test_images_are_the_dockerfiles_documented_builds() -> None:
    """What compose builds is tagged as each Dockerfile's header builds it by hand (and as
    the Kubernetes manifests name it), not as an untagged ``latest`` beside it."""
    documented = dockerfile_builds()
    built = 0
    for name, svc in _services().items():
        if "build" not in svc:
            continue
        dockerfile = svc["build"]["dockerfile"]
        assert svc["image"] == documented[dockerfile], (name, dockerfile)
        built += 1
    assert built == len(_services())
