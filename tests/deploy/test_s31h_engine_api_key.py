"""The engines run behind their API key by default: in deploy/k8s the engine Deployment reads
it from the ``kvgate-engine`` Secret the operator creates (as documented beside the other
Secrets), the gateway reads the same Secret and its discovery source sends the key to every
engine it finds, while the probes' and Prometheus' paths need none; compose passes
``KVGATE_ENGINE_API_KEY``, when set, to the engines and the gateway alike."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from engine import cli as engine_cli
from engine.api_key import API_KEY_ENV, OPEN_PATHS, resolve_api_key
from engine.server import EngineServer, build_app
from gateway.config import load_config
from gateway.discovery.config import KubernetesSourceConfig
from kvwire.tokenizer import load_tokenizer
from tests.deploy.builds import DEPLOY_DOC
from tests.deploy.k8s_bundle import (
    ROOT,
    Objects,
    container,
    gateway_config,
    needs_kubectl,
    secret_env,
    set_secret_env,
    stand_in,
)
from tests.support.engine_servers import served_core
from tests.support.gateway_harness import Serve

DEPLOY = ROOT / "deploy"
ENGINE_SECRET = ("kvgate-engine", "api-key")
KEY = stand_in(ENGINE_SECRET)


def _engine_key(objects: Objects, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The key the engine container serves with, its Secret holding ``KEY``: resolved by the
    engine's own flags from the Deployment's args and environment."""
    c = container(objects[("Deployment", "kvgate-engine")])
    set_secret_env(c, monkeypatch)
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(c["args"])
    return resolve_api_key(args.api_key, args.api_key_file)


@needs_kubectl
def test_the_engines_serve_with_the_secrets_key(objects: Objects,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    c = container(objects[("Deployment", "kvgate-engine")])
    assert secret_env(c).get(API_KEY_ENV) == ENGINE_SECRET
    assert _engine_key(objects, monkeypatch) == KEY


@needs_kubectl
def test_the_gateway_sends_the_key_to_every_engine_it_discovers(
        objects: Objects, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    (source,) = gateway_config(objects, monkeypatch, tmp_path).discovery
    assert isinstance(source, KubernetesSourceConfig)
    # in the variable its container reads from the engines' Secret, never in the ConfigMap
    assert source.replica.api_key is None and source.replica.api_key_file is None
    assert source.replica.api_key_env is not None
    gateway = container(objects[("Deployment", "kvgate-gateway")])
    assert secret_env(gateway)[source.replica.api_key_env] == ENGINE_SECRET
    found = source.replica.replica("kvgate-engine-7d9f-abcde", "10.1.2.3", 8000)
    assert found.resolved_api_key() == KEY


@needs_kubectl
def test_probes_and_scrapes_need_no_key_the_rest_needs_the_gateways(
        objects: Objects, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path, serve: Serve) -> None:
    """An engine served with the key its Deployment gives it answers its probes' and the
    ServiceMonitor's paths without one, refuses its control endpoints without one, and
    serves them with the key the gateway sends a discovered engine."""
    c = container(objects[("Deployment", "kvgate-engine")])
    open_paths = {c[probe]["httpGet"]["path"] for probe in
                  ("startupProbe", "readinessProbe", "livenessProbe") if probe in c}
    assert open_paths
    monitor = objects[("ServiceMonitor", "kvgate-engine")]
    scraped = {ep.get("path", "/metrics") for ep in monitor["spec"]["endpoints"]}
    assert scraped and scraped <= OPEN_PATHS
    key = _engine_key(objects, monkeypatch)
    assert key is not None
    (source,) = gateway_config(objects, monkeypatch, tmp_path).discovery
    sent = source.replica.replica("engine-0", "127.0.0.1", 8000).resolved_api_key()

    srv = EngineServer(served_core(), load_tokenizer(None), model_name="tiny-sim",
                       sleep_modeled_time=False)
    with httpx.Client(base_url=serve(build_app(srv, api_key=key)).url, timeout=10) as http:
        for path in sorted(open_paths | scraped):
            assert http.get(path).status_code == 200, path
        for method, path in (("POST", "/flush_cache"), ("POST", "/reset_prefix_cache"),
                             ("GET", "/v1/models")):
            refused = http.request(method, path)
            assert refused.status_code == 401, (path, refused.status_code)
            served = http.request(method, path, headers={"authorization": f"Bearer {sent}"})
            assert served.status_code == 200, (path, served.status_code, served.text)


def _created_secrets(text: str) -> set[tuple[str, str]]:
    """(Secret, key) of each ``kubectl -n llm create secret generic`` line in ``text``."""
    return set(re.findall(r"kubectl -n llm create secret generic ([\w.-]+) "
                          r"--from-literal=([\w.-]+)=\"\$\(openssl rand -hex \d+\)\"", text))


def test_created_secrets() -> None:
    assert _created_secrets('#   kubectl -n llm create secret generic a-b '
                            '--from-literal=c-d="$(openssl rand -hex 24)"\n') == {("a-b", "c-d")}
    assert _created_secrets("kubectl -n llm create secret generic a --from-file=k=f") == set()


@needs_kubectl
def test_every_secret_read_is_one_the_docs_create(objects: Objects) -> None:
    """What the Deployments read from Secrets, the operator is told to create: in the
    kustomization's header and in docs/deploy.md's Kubernetes section."""
    read = {ref for name in ("kvgate-engine", "kvgate-gateway")
            for ref in secret_env(container(objects[("Deployment", name)])).values()}
    assert ENGINE_SECRET in read
    header = (DEPLOY / "k8s" / "kustomization.yaml").read_text()
    doc = DEPLOY_DOC.read_text()
    section = doc[doc.index("\n## On Kubernetes\n"):]
    section = section[:section.index("\n## ", 1)]
    assert read <= _created_secrets(header), read - _created_secrets(header)
    assert read <= _created_secrets(section), read - _created_secrets(section)


def _compose_services() -> dict[str, Any]:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert isinstance(services, dict)
    return services


def _passes_through(environment: Any, name: str) -> bool:
    """Whether a compose ``environment`` gives ``name`` no value: the host's is passed, or
    none is set in the container (an empty one would stop the engine)."""
    if isinstance(environment, list):
        return name in environment
    return isinstance(environment, dict) and name in environment and environment[name] is None


def test_compose_gives_the_engines_and_the_gateway_one_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    services = _compose_services()
    engines = {name for name in services if name.startswith("engine-")}
    assert engines
    for name in engines:
        assert _passes_through(services[name].get("environment"), API_KEY_ENV), name
    gateway = services["gateway"]
    # compose passes the host's value, empty when the host has none
    assert gateway["environment"][API_KEY_ENV] == f"${{{API_KEY_ENV}:-}}"
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "")
    mount = next(v for v in gateway["volumes"] if v.endswith(":/etc/kvgate/gateway.yaml:ro"))
    config_path = DEPLOY / mount.split(":")[0]

    monkeypatch.setenv(API_KEY_ENV, KEY)  # set on the host: both sides hold it
    assert resolve_api_key(None, None) == KEY
    config = load_config(config_path)
    assert {r.id for r in config.replicas} == engines
    assert {r.resolved_api_key() for r in config.replicas} == {KEY}

    monkeypatch.delenv(API_KEY_ENV)  # unset on the host: the engines take none ...
    assert resolve_api_key(None, None) is None
    monkeypatch.setenv(API_KEY_ENV, "")  # ... and the gateway, given it empty, sends none
    assert {r.resolved_api_key() for r in load_config(config_path).replicas} == {None}
