"""deploy/k8s rendered with ``kubectl kustomize`` and checked: every built-in object against
the Kubernetes JSON schemas (kubernetes-validate, strict: unknown fields fail), the
ServiceMonitors (a CRD it has no schema for) by their required structure here, and the
parts that must agree with each other and with kvgate itself (the gateway config, the
commands, the ports, the RBAC discovery needs)."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from engine import cli as engine_cli
from gateway import serve as gateway_cli
from gateway.config import parse_config
from gateway.discovery.config import KubernetesSourceConfig
from gateway.peer_config import split_address
from tests.support.binaries import which

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = which("kubectl", "Debian's kubernetes-client")
# the oldest Kubernetes the manifests claim to fit, and the newest schemas known
VERSIONS = ("1.27.0", kubernetes_validate.latest_version())

pytestmark = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed (.ci/run installs Debian's "
    "kubernetes-client; locally: apt-get install kubernetes-client)")

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], Obj]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(ROOT / "deploy" / "k8s")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    found = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(found) == len(docs), "two objects share a kind and name"
    return found


def by_kind(objects: dict[tuple[str, str], Obj], kind: str) -> dict[str, Obj]:
    return {name: obj for (k, name), obj in objects.items() if k == kind}


def test_the_bundle_holds_what_a_fleet_needs(objects: dict[tuple[str, str], Obj]) -> None:
    kinds = sorted(k for k, _ in objects)
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "Role", "RoleBinding",
                     "Service", "Service", "Service", "ServiceAccount", "ServiceMonitor",
                     "ServiceMonitor"]
    assert {o["metadata"].get("namespace") for o in objects.values()} == {"llm"}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_builtin_object_matches_the_schema(objects: dict[tuple[str, str], Obj],
                                                 version: str) -> None:
    checked = 0
    for (kind, name), obj in objects.items():
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: kubernetes-validate has no schema (see the next test)
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{kind}/{name} (Kubernetes {version}): {exc.message} "
                                 f"at {list(exc.path)}") from None
        checked += 1
    assert checked == len(objects) - 2


DURATION = re.compile(r"^(\d+(ms|s|m|h))+$")


def test_service_monitors_by_structure(objects: dict[tuple[str, str], Obj]) -> None:
    """What the Prometheus Operator's CRD requires and uses, checked by hand: each selects
    a Service by its labels and scrapes a port that Service names."""
    services = by_kind(objects, "Service")
    for name, monitor in by_kind(objects, "ServiceMonitor").items():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
        spec = monitor["spec"]
        assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
        wanted = spec["selector"]["matchLabels"]
        assert isinstance(wanted, dict) and wanted, name
        matching = [s for s in services.values()
                    if wanted.items() <= s["metadata"].get("labels", {}).items()]
        assert len(matching) == 1, f"ServiceMonitor {name} selects {len(matching)} Services"
        port_names = {p["name"] for p in matching[0]["spec"]["ports"]}
        assert spec["endpoints"], name
        for ep in spec["endpoints"]:
            assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
            assert ep["port"] in port_names, f"{name}: no port {ep['port']!r}"
            assert ep["path"] == "/metrics"
            assert DURATION.match(ep["interval"]), ep["interval"]


def container(deployment: Obj) -> Obj:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


def probes_use_named_ports(c: Obj) -> None:
    names = {p["name"] for p in c["ports"]}
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in c:
            assert c[probe]["httpGet"]["port"] in names, probe


def test_gateway(objects: dict[tuple[str, str], Obj], monkeypatch: pytest.MonkeyPatch
                 ) -> None:
    deployment = objects[("Deployment", "kvgate-gateway")]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    probes_use_named_ports(c)
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    # the command parses with kvgate serve's own arguments; its config is the ConfigMap's
    parser = argparse.ArgumentParser()
    gateway_cli.add_arguments(parser)
    args = parser.parse_args(c["args"])
    mount = next(m for m in c["volumeMounts"] if args.config.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    config_map = objects[("ConfigMap", volume["configMap"]["name"])]
    env = {e["name"]: e for e in c["env"]}
    raw = yaml.safe_load(config_map["data"][Path(args.config).name])
    # the admin token comes from a Secret, through the variable the config names
    token_env = raw["admin"]["token_env"]
    assert env[token_env]["valueFrom"]["secretKeyRef"]["name"] == "kvgate-admin"
    monkeypatch.setenv(token_env, "a-token-long-enough-0123")
    # so does the peers' secret
    peer_env = raw["peers"]["secret_env"]
    assert env[peer_env]["valueFrom"]["secretKeyRef"]["name"] == "kvgate-peers"
    monkeypatch.setenv(peer_env, "a-peer-secret-long-enough-0123")
    config = parse_config(raw, "gateway.yaml")
    assert config.admin.host == "127.0.0.1"
    assert pod["terminationGracePeriodSeconds"] > config.shutdown.timeout_s
    # the Service carries the OpenAI port only, never the admin listener's
    service = objects[("Service", "kvgate-gateway")]
    (port,) = service["spec"]["ports"]
    by_name = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert by_name[port["targetPort"]] == config.port
    assert config.admin.port not in by_name.values()
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    # the copies find each other on a headless Service of every gateway pod, ready or not,
    # on the port their peers listen on
    (address,) = config.peers.addresses
    peer_host, peer_port = split_address(address, "peers.addresses")
    peers = objects[("Service", peer_host)]
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"]
    assert peers["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    (peer_service_port,) = peers["spec"]["ports"]
    assert config.peers.listen is not None
    assert peer_service_port["port"] == peer_port
    assert by_name[peer_service_port["targetPort"]] == \
        split_address(config.peers.listen, "peers.listen", any_port=True)[1]
    # discovery finds the engines' headless Service by name and port name
    (source,) = config.discovery
    assert isinstance(source, KubernetesSourceConfig)
    engines = objects[("Service", str(source.service))]
    assert engines["spec"]["clusterIP"] == "None"
    engine_ports = {p["name"] for p in engines["spec"]["ports"]}
    assert {source.port_name, source.kv_events_port_name,
            source.kv_events_replay_port_name} <= engine_ports


def test_discovery_rbac(objects: dict[tuple[str, str], Obj]) -> None:
    deployment = objects[("Deployment", "kvgate-gateway")]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert ("ServiceAccount", account) in objects
    (binding,) = by_kind(objects, "RoleBinding").values()
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": "llm"}]
    role = objects[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    for group, resource in (("discovery.k8s.io", "endpointslices"), ("", "pods")):
        for verb in ("get", "list", "watch"):
            assert (group, resource, verb) in granted
    assert all(verb in ("get", "list", "watch") for _, _, verb in granted)  # read only


def test_engine(objects: dict[tuple[str, str], Obj]) -> None:
    deployment = objects[("Deployment", "kvgate-engine")]
    c = container(deployment)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    probes_use_named_ports(c)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(c["args"])
    assert args.executor == "torch" and args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["http"] == args.port
    assert args.kv_events_endpoint == f"tcp://*:{ports['kv-events']}"
    assert args.kv_events_replay_endpoint == f"tcp://*:{ports['kv-events-replay']}"
    service = objects[("Service", "kvgate-engine")]
    assert service["spec"]["selector"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
