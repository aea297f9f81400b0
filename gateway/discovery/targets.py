"""What a discovery source found, as the replicas it wants in the fleet.

Pure functions over the API's JSON (``discovery.k8s.io/v1`` EndpointSlices, ``v1`` Pods)
and over resolved addresses; each returns ``{replica id: ReplicaConfig}``.

EndpointSlice conditions, as the API defines them: ``ready`` unset means ready;
``serving`` unset means as ``ready`` says; ``terminating`` unset means not terminating. A ready
endpoint counts. When none of the Service's endpoints is ready, the serving ones that are
terminating count instead (kube-proxy's fallback: a rollout that left only draining pods
still answers rather than failing every request).

A dual-stack Service has a slice per address family listing the same pods: a pod's
address is taken from its IPv4 slice when that one counts it, else its IPv6 one, whatever
order the slices come in (the API lists them by name, a watch appends a new one), so a
pod never moves from one of its addresses to the other between two lists.

A Kubernetes source keeps what each object gives (``slice_found``, ``pod_target``) and,
when one object changes, works that one out again: ``combined`` then makes the set of a
Service's slices with no replica config built anew.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import ReplicaConfig
from gateway.discovery.config import DNSSourceConfig, KubernetesSourceConfig, host_in_url

log = logging.getLogger("kvgate.discovery")

Targets = dict[str, ReplicaConfig]


def dns_targets(source: DNSSourceConfig, addresses: Iterable[str]) -> Targets:
    """One replica per address, at the source's port; id ``address:port``."""
    targets: Targets = {}
    for address in sorted(set(addresses)):
        rid = f"{host_in_url(address)}:{source.port}"
        targets[rid] = source.replica.replica(rid, address, source.port)
    return targets


def _named_ports(ports: Iterable[Mapping[str, Any]]) -> dict[str | None, int]:
    """A slice's TCP ports by name; one out of 1..65535 (no API server writes one) is
    left out, as if the slice did not name it."""
    named: dict[str | None, int] = {}
    for p in ports:
        port = p.get("port") if isinstance(p, Mapping) else None
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 \
                and p.get("protocol", "TCP") == "TCP":
            named.setdefault(p.get("name") or None, port)
    return named


def _serving_port(source: KubernetesSourceConfig, named: dict[str | None, int]
                  ) -> int | None:
    if source.port is not None:
        return source.port
    if source.port_name is not None:
        return named.get(source.port_name)
    others = {n: p for n, p in named.items()
              if n not in (source.kv_events_port_name, source.replay_port_name)}
    return next(iter(others.values())) if len(others) == 1 else None


ADDRESS_TYPES = {"IPv4": 0, "IPv6": 1}  # a pod in two slices: the first family that counts it


def _slice_order(s: Mapping[str, Any]) -> tuple[int, str]:
    family = ADDRESS_TYPES.get(str(s.get("addressType")), len(ADDRESS_TYPES))
    return family, str((s.get("metadata") or {}).get("name", ""))


@dataclass(frozen=True, slots=True)
class SliceFound:
    """What one EndpointSlice gives: its place in the order slices are combined in
    (``_slice_order``), and its ready endpoints and its serving terminating ones."""

    order: tuple[int, str]
    ready: Targets
    draining: Targets


def slice_found(source: KubernetesSourceConfig, s: Mapping[str, Any]) -> SliceFound:
    """The replicas of one EndpointSlice, ready or draining (see the module's rule on
    conditions); an endpoint listed twice in it once."""
    ready: Targets = {}
    draining: Targets = {}
    found = SliceFound(_slice_order(s), ready, draining)
    name = s.get("metadata", {}).get("name", "?")
    named = _named_ports(s.get("ports") or [])
    port = _serving_port(source, named)
    if port is None:
        if s.get("endpoints"):
            log.warning("discovery %s: EndpointSlice %s has no port %s (ports: %s)",
                        source.label, name, source.port_name or "to choose",
                        sorted(str(n) for n in named))
        return found
    events = named.get(source.kv_events_port_name)
    replay = named.get(source.replay_port_name)
    for ep in s.get("endpoints") or []:
        addresses = ep.get("addresses") or []
        if not addresses:
            continue
        cond = ep.get("conditions") or {}
        target_ref = ep.get("targetRef") or {}
        address = addresses[0]  # the API: consumers use the first
        rid = target_ref.get("name") or f"{host_in_url(address)}:{port}"
        config = source.replica.replica(rid, address, port, events, replay)
        if cond.get("ready") is not False:
            ready.setdefault(rid, config)
        # not ready here, so serving unset means not serving
        elif cond.get("serving") is True and cond.get("terminating") is True:
            draining.setdefault(rid, config)
    return found


def combined(slices: Iterable[SliceFound]) -> Targets:
    """The replicas behind a Service, from what each of its slices gives: the ready ones,
    else the draining ones; one in two slices from the first in ``order``."""
    ready: Targets = {}
    draining: Targets = {}
    for found in sorted(slices, key=lambda f: f.order):
        for rid, config in found.ready.items():
            ready.setdefault(rid, config)
        for rid, config in found.draining.items():
            draining.setdefault(rid, config)
    return ready or draining


def slice_targets(source: KubernetesSourceConfig, slices: Iterable[Mapping[str, Any]]
                  ) -> Targets:
    """The replicas behind a Service's EndpointSlices (see the module's rule on
    conditions and address families); an endpoint listed in two slices (as during a
    slice's update, or in both families' slices) once."""
    return combined(slice_found(source, s) for s in slices)


def _container_ports(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's container ports, shaped as an EndpointSlice's (name, port, protocol)."""
    ports = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            ports.append({"name": p.get("name"), "port": p.get("containerPort"),
                          "protocol": p.get("protocol", "TCP")})
    return ports


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _annotated_port(source: KubernetesSourceConfig, annotations: Mapping[str, str],
                    key: str, pod: str) -> int | None:
    value = annotations.get(key)
    if value is None:
        return None
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        log.warning("discovery %s: pod %s: annotation %s=%r is not a port", source.label,
                    pod, key, value)
        return None
    return port


def pod_target(source: KubernetesSourceConfig, pod: Mapping[str, Any]
               ) -> ReplicaConfig | None:
    """The replica of a pod, its id the pod's name; None unless the pod is ready (phase
    Running, condition Ready, not being deleted) with an IP and a port to serve on."""
    meta = pod.get("metadata") or {}
    address = (pod.get("status") or {}).get("podIP")
    if not address or not _pod_ready(pod):
        return None
    name = meta.get("name") or address
    named = _named_ports(_container_ports(pod))
    port = _serving_port(source, named)
    if port is None:
        log.warning("discovery %s: pod %s has no port %s", source.label, name,
                    source.port_name or "to choose")
        return None
    annotations = meta.get("annotations") or {}
    events = _annotated_port(source, annotations, source.kv_events_annotation, name) \
        or named.get(source.kv_events_port_name)
    replay = _annotated_port(source, annotations, source.kv_events_replay_annotation,
                             name) or named.get(source.replay_port_name)
    return source.replica.replica(name, address, port, events, replay)


def pod_targets(source: KubernetesSourceConfig, pods: Iterable[Mapping[str, Any]]
                ) -> Targets:
    """The replicas of the ready pods (``pod_target``)."""
    return {config.id: config for pod in pods
            if (config := pod_target(source, pod)) is not None}
