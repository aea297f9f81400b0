"""Port names in deploy/k8s as the API server checks them, which the JSON schemas do not:
a container's port name, and a name a probe, a Service's targetPort or a NetworkPolicy
uses to point at one, must be an IANA service name (apimachinery's IsValidPortName: at
most 15 characters of a-z, 0-9 and '-', a letter among them, no '-' first, last or twice
in a row). One too long renders and passes kubernetes-validate, and then ``kubectl
apply`` refuses the Deployment, the Service and the NetworkPolicy naming it."""

from __future__ import annotations

import re
from collections.abc import Iterator

from tests.deploy.k8s_bundle import Obj, Objects, needs_kubectl


def port_name_errors(name: str) -> list[str]:
    """What apimachinery's ``validation.IsValidPortName`` says of ``name`` (none: valid)."""
    errors = []
    if len(name) > 15:
        errors.append("must be no more than 15 characters")
    if not re.fullmatch(r"[-a-z0-9]+", name):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and "
                      "hyphens (-)")
    if not re.search(r"[a-z]", name):
        errors.append("must contain at least one letter (a-z)")
    if "--" in name:
        errors.append("must not contain consecutive hyphens")
    if name.startswith("-") or name.endswith("-"):
        errors.append("must not begin or end with a hyphen")
    return errors


def test_port_name_errors() -> None:
    for good in ("http", "kv-events", "peers", "a23456789012345"):
        assert port_name_errors(good) == [], good
    for bad in ("a234567890123456", "kv-events-replay", "Http", "8000", "kv--x", "-x"):
        assert port_name_errors(bad), bad


def named_ports(obj: Obj) -> Iterator[tuple[str, str]]:
    """(where, name) of every port ``obj`` names, as a container port or a reference to
    one; ports given by number are left out."""
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "Deployment":
        for c in obj["spec"]["template"]["spec"]["containers"]:
            for p in c.get("ports", []):
                if "name" in p:
                    yield f"{name}: containers[{c['name']}].ports", p["name"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str):
                    yield f"{name}: containers[{c['name']}].{probe}", port
    elif kind == "Service":
        for p in obj["spec"]["ports"]:
            if isinstance(p.get("targetPort"), str):
                yield f"Service {name}: ports[{p['name']}].targetPort", p["targetPort"]
    elif kind == "NetworkPolicy":
        for rule in obj["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                if isinstance(p.get("port"), str):
                    yield f"NetworkPolicy {name}: ingress port", p["port"]


@needs_kubectl
def test_every_port_name_is_one_the_api_server_takes(objects: Objects) -> None:
    found = [(where, name) for obj in objects.values() for where, name in named_ports(obj)]
    assert len(found) > 10  # the containers' ports, probes, targetPorts, policies
    refused = {f"{where}: {name!r}": port_name_errors(name) for where, name in found
               if port_name_errors(name)}
    assert refused == {}
