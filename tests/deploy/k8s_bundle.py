"""deploy/k8s as ``kubectl kustomize`` renders it, and what the tests read from it: its
objects by (kind, name), a Deployment's container, the Secrets a container reads, and the
gateway's config as ``kvgate serve`` loads it from the ConfigMap. The ``objects`` fixture
(tests/deploy/conftest.py) renders the bundle once a session."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway import serve as gateway_cli
from gateway.config import GatewayConfig, load_config
from tests.support.binaries import which

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = which("kubectl", "Debian's kubernetes-client")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed (.ci/run installs Debian's "
    "kubernetes-client; locally: apt-get install kubernetes-client)")

Obj = dict[str, Any]
Objects = dict[tuple[str, str], Obj]


def kustomize() -> str:
    """deploy/k8s rendered by ``kubectl kustomize``, as YAML documents."""
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, "kustomize", str(ROOT / "deploy" / "k8s")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def objects_of(rendered: str) -> Objects:
    """The objects of ``rendered`` by (kind, name); two sharing both fail."""
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    found = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(found) == len(docs), "two objects share a kind and name"
    return found


def container(deployment: Obj) -> Obj:
    """The Deployment's one container."""
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


def secret_env(c: Obj) -> dict[str, tuple[str, str]]:
    """The container's variables read from a Secret: name -> (Secret, key); each one
    required (a pod whose Secret is missing does not start, it never runs without it)."""
    found = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref is not None:
            assert not ref.get("optional", False), e["name"]
            found[e["name"]] = (ref["name"], ref["key"])
    return found


def stand_in(secret: tuple[str, str]) -> str:
    """What the tests put in the key ``secret`` (Secret, key): one value a Secret's key,
    long enough for every secret kvgate checks the length of."""
    return f"{secret[0]}-{secret[1]}-stand-in-0123456789"


def set_secret_env(c: Obj, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variable the container reads from a Secret set, to its key's stand-in."""
    for name, secret in secret_env(c).items():
        monkeypatch.setenv(name, stand_in(secret))


def gateway_config_text(objects: Objects) -> str:
    """The gateway's config file, from the ConfigMap mounted where its command reads it."""
    deployment = objects[("Deployment", "kvgate-gateway")]
    c = container(deployment)
    parser = argparse.ArgumentParser()
    gateway_cli.add_arguments(parser)
    args = parser.parse_args(c["args"])
    mount = next(m for m in c["volumeMounts"] if args.config.startswith(m["mountPath"] + "/"))
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == mount["name"])
    data = objects[("ConfigMap", volume["configMap"]["name"])]["data"]
    text = data[Path(args.config).name]
    assert isinstance(text, str)
    return text


def gateway_config(objects: Objects, monkeypatch: pytest.MonkeyPatch,
                   tmp_path: Path) -> GatewayConfig:
    """The gateway's config as ``kvgate serve`` loads it from the ConfigMap its command
    reads, every variable its container reads from a Secret set to that key's stand-in
    (``set_secret_env``)."""
    set_secret_env(container(objects[("Deployment", "kvgate-gateway")]), monkeypatch)
    path = tmp_path / "gateway.yaml"
    path.write_text(gateway_config_text(objects))
    return load_config(path)
