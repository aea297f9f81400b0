"""The ``discovery:`` list of the gateway's YAML: where replicas are found at run time.

Example::

    discovery:
      - type: dns                 # A (else AAAA) records of a headless Service
        name: vllm-headless.llm.svc.cluster.local
        port: 8000
        interval_s: 10            # times are seconds: at least 0.01 (timeout_s 0.001)
        replica: {api_key_env: VLLM_API_KEY, kv_events_port: 5557}
      - type: kubernetes          # EndpointSlices of a Service (or pods by label)
        namespace: llm
        service: vllm             # or label_selector: "app=vllm"
        port_name: http
        replica: {api_key_file: /var/run/secrets/vllm/key}

``replica`` holds what every replica the source finds gets: ``ReplicaConfig``'s settings
less ``id`` and ``url``, plus the ports its KV events are published on when the backend
does not tell them.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from gateway.least_seconds import LEAST_INTERVAL_S, LEAST_TIMEOUT_S, at_least

if TYPE_CHECKING:  # gateway.config lists the sources: imported late, where needed
    from gateway.config import ReplicaConfig


def host_in_url(host: str) -> str:
    """``host`` as written in a URL or a ZMQ endpoint (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True, slots=True)
class ReplicaTemplate:
    scheme: Literal["http", "https"] = "http"
    base_path: str = ""  # e.g. "/vllm" when replicas serve under a path
    weight: float = 1.0
    kv_capacity_tokens: int | None = None
    api_key: str | None = None
    api_key_file: str | None = None
    api_key_env: str | None = None
    kv_events_port: int | None = None  # when the backend names none for a replica
    kv_events_replay_port: int | None = None
    data_parallel_size: int = 1  # each replica's ranks (gateway.data_parallel)

    def validate(self) -> None:
        for key in ("kv_events_port", "kv_events_replay_port"):
            _port_or_none(key, getattr(self, key))
        if self.base_path and not self.base_path.startswith("/"):
            raise ValueError(f"base_path {self.base_path!r} must start with '/'")
        self.replica("template", "127.0.0.1", 1).validate()  # the rest, as a replica

    def replica(self, replica_id: str, host: str, port: int, kv_events_port: int | None = None,
                kv_events_replay_port: int | None = None) -> ReplicaConfig:
        """The config of the replica ``replica_id`` found at ``host:port``; its KV event
        ports, when given, win over the template's."""
        from gateway.config import ReplicaConfig

        where = host_in_url(host)
        events = kv_events_port or self.kv_events_port
        replay = kv_events_replay_port or self.kv_events_replay_port
        return ReplicaConfig(
            id=replica_id, url=f"{self.scheme}://{where}:{port}{self.base_path}",
            weight=self.weight, kv_capacity_tokens=self.kv_capacity_tokens,
            api_key=self.api_key, api_key_file=self.api_key_file, api_key_env=self.api_key_env,
            kv_events=f"tcp://{where}:{events}" if events else None,
            kv_events_replay=f"tcp://{where}:{replay}" if events and replay else None,
            data_parallel_size=self.data_parallel_size)


@dataclass(frozen=True, slots=True)
class DNSSourceConfig:
    """The A (else AAAA) records of ``name``, re-resolved every ``interval_s``: the first
    of ``record_types`` the name has records of (a dual-stack pod has one of each, one
    engine), or with ``all_record_types`` every one of them (single-stack pods of either
    family, each its own engine); the replica's id is ``address:port``. A failed lookup
    (or one that finds no address) keeps the last set it found; a replica is removed once
    it is missing from ``remove_after`` answers in a row."""

    name: str
    port: int
    type: Literal["dns"] = "dns"
    interval_s: float = 10.0
    timeout_s: float = 2.0
    record_types: list[Literal["A", "AAAA"]] = field(default_factory=lambda: ["A", "AAAA"])
    all_record_types: bool = False
    nameservers: list[str] = field(default_factory=list)  # none: the system's resolv.conf
    nameserver_port: int = 53
    remove_after: int = 2
    replica: ReplicaTemplate = field(default_factory=ReplicaTemplate)

    @property
    def label(self) -> str:
        """The source's name in metrics, logs and its replicas' ``source``: two sources
        of one name on two ports are two sources."""
        return f"dns:{self.name}:{self.port}"

    def validate(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")
        _port_or_none("port", self.port)
        _port_or_none("nameserver_port", self.nameserver_port)
        at_least(self, LEAST_INTERVAL_S, "interval_s")  # a lookup every interval_s
        at_least(self, LEAST_TIMEOUT_S, "timeout_s")
        if not self.record_types:
            raise ValueError("record_types must name A, AAAA or both")
        for server in self.nameservers:  # as the resolver takes them: else found at start
            if not server.startswith("https://"):
                try:
                    ipaddress.ip_address(server)
                except ValueError:
                    raise ValueError(f"nameservers: {server!r} is not an IP address (the "
                                     "port is nameserver_port)") from None
        if not 1 <= self.remove_after <= 100:
            raise ValueError(f"remove_after must be in [1, 100], got {self.remove_after!r}")


CONTAINER_PORT_NAME_MAX = 15  # Kubernetes' limit (an IANA service name); a Service's is 63


@dataclass(frozen=True, slots=True)
class KubernetesSourceConfig:
    """The ready endpoints of ``service`` (its EndpointSlices), or the ready pods matching
    ``label_selector``, followed by list+watch; a full list at least every ``resync_s``.
    The API is reached with ``kubeconfig`` or ``context`` when either is given (the
    default kubeconfig file for a context alone), else in-cluster (service account) when
    running in a pod, else the default kubeconfig.

    A replica's port: ``port`` when set, else the port named ``port_name`` (of the
    Service, or of the pod's containers), else the only one. Its KV event ports: the ports
    named ``kv_events_port_name`` / ``replay_port_name``, or (pods) the annotations
    ``kv_events_annotation`` / ``kv_events_replay_annotation``, else the template's. Its
    id: the pod's name (else ``address:port``)."""

    type: Literal["kubernetes"] = "kubernetes"
    namespace: str | None = None  # none: the pod's own (in cluster), else the kubeconfig's
    service: str | None = None
    label_selector: str | None = None
    port_name: str | None = None
    port: int | None = None
    kv_events_port_name: str = "kv-events"
    # none: "kv-events-replay" for a Service's port, "kv-replay" for a pod's container port
    # (whose name is at most 15 characters)
    kv_events_replay_port_name: str | None = None
    kv_events_annotation: str = "kvgate.io/kv-events-port"
    kv_events_replay_annotation: str = "kvgate.io/kv-events-replay-port"
    resync_s: float = 300.0
    # first wait after a failed list or watch; doubles up to 30 s (a longer one stays)
    retry_s: float = 1.0
    kubeconfig: str | None = None
    context: str | None = None
    replica: ReplicaTemplate = field(default_factory=ReplicaTemplate)

    @property
    def label(self) -> str:
        """The source's name in metrics, logs and its replicas' ``source``: one service
        (or selector) seen in two clusters, or on two ports, is two sources."""
        what = f"service={self.service}" if self.service else f"pods={self.label_selector}"
        label = f"kubernetes:{self.namespace}/{what}" if self.namespace else f"kubernetes:{what}"
        where = (("port", self.port), ("port_name", self.port_name),
                 ("context", self.context), ("kubeconfig", self.kubeconfig))
        return label + "".join(f" {key}={value}" for key, value in where if value is not None)

    @property
    def replay_port_name(self) -> str:
        """The name of a replica's KV event replay port: ``kv_events_replay_port_name``,
        or by default ``kv-events-replay`` (a Service's port) or ``kv-replay`` (a
        container's, which cannot be named the longer way)."""
        if self.kv_events_replay_port_name is not None:
            return self.kv_events_replay_port_name
        return "kv-events-replay" if self.service is not None else "kv-replay"

    def validate(self) -> None:
        if (self.service is None) == (self.label_selector is None):
            raise ValueError(f"set exactly one of service and label_selector, got service="
                             f"{self.service!r}, label_selector={self.label_selector!r}")
        if self.service == "" or self.label_selector == "":
            raise ValueError("service and label_selector must not be empty")
        _port_or_none("port", self.port)
        if self.label_selector is not None:  # the names are a pod's container ports'
            for key in ("port_name", "kv_events_port_name", "kv_events_replay_port_name"):
                name = getattr(self, key)
                if name is not None and len(name) > CONTAINER_PORT_NAME_MAX:
                    raise ValueError(
                        f"{key} {name!r} is no container port's name: pods' port names "
                        f"are at most {CONTAINER_PORT_NAME_MAX} characters")
        if self.namespace == "":
            raise ValueError("namespace must not be empty (leave it out for the pod's own, "
                             "or the kubeconfig's)")
        if self.kubeconfig is not None and not any(
                Path(part).expanduser().is_file()
                for part in self.kubeconfig.split(os.pathsep) if part):
            # read as KUBECONFIG is: '~' is the home directory, a list of paths merged
            raise ValueError(f"kubeconfig {self.kubeconfig!r} names no file")
        # a full list every resync_s; after a failure one every retry_s, at first
        at_least(self, LEAST_INTERVAL_S, "resync_s", "retry_s")


DiscoverySourceConfig = DNSSourceConfig | KubernetesSourceConfig


def _port_or_none(key: str, value: int | None) -> None:
    if value is not None and not 0 < value < 65536:
        raise ValueError(f"{key} must be a port (1-65535), got {value!r}")
