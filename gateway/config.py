"""The gateway's YAML configuration, validated strictly on load.

Example (every key but ``replicas`` has a default)::

    host: 127.0.0.1
    port: 8000
    tokenizer: null              # directory or tokenizer.json; null = project tokenizer
    admin_token: null            # when set, /admin/* needs "Authorization: Bearer <token>"
    max_body_bytes: 4194304
    affinity: {header: x-kvgate-affinity-key, body_field: null}
    tenancy: {isolate: false, header: x-kvgate-tenant, secret: "", require_tenant: false}
    policy: {name: prefix_affinity, prefix_tokens: 1024, overload: 1.25}
    replicas:
      - {id: r0, url: "http://127.0.0.1:8101"}
      - {id: r1, url: "http://127.0.0.1:8102", weight: 2}
      - {id: r2, url: "http://127.0.0.1:8103", kv_events: "tcp://127.0.0.1:5557"}
    timeouts: {connect_s: 2, first_byte_s: 300, idle_s: 60}
    health: {interval_s: 2, timeout_s: 1, failures_to_eject: 2, successes_to_readmit: 1}
    scrape: {interval_s: 1, timeout_s: 1, hit_rate_window_s: 60}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.tenancy import TenancyConfig
from policies.config import ConfigError, from_mapping


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    id: str
    url: str
    weight: float = 1.0
    kv_events: str | None = None  # the replica's KV event PUB endpoint (policy kv_events)
    # KV capacity in the replica's tokens, for replicas whose /metrics tell none
    kv_capacity_tokens: int | None = None

    def validate(self) -> None:
        if not self.id:
            raise ValueError("replica id must not be empty")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url {self.url!r} is not an http(s) URL")
        if self.weight <= 0:
            raise ValueError(f"weight must be > 0, got {self.weight!r}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens!r}")
        if self.kv_events is not None and not self.kv_events.startswith(
                ("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"kv_events {self.kv_events!r} is not a tcp://, ipc:// or "
                             "inproc:// endpoint")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    connect_s: float = 2.0
    first_byte_s: float = 300.0
    idle_s: float = 60.0

    def validate(self) -> None:
        _positive(self, "connect_s", "first_byte_s", "idle_s")


@dataclass(frozen=True, slots=True)
class HealthConfig:
    interval_s: float = 2.0
    timeout_s: float = 1.0
    failures_to_eject: int = 2
    successes_to_readmit: int = 1
    models_refresh_s: float = 30.0

    def validate(self) -> None:
        _positive(self, "interval_s", "timeout_s", "failures_to_eject",
                  "successes_to_readmit", "models_refresh_s")


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    interval_s: float = 1.0
    timeout_s: float = 1.0
    hit_rate_window_s: float = 60.0
    enabled: bool = True

    def validate(self) -> None:
        _positive(self, "interval_s", "timeout_s", "hit_rate_window_s")


@dataclass(frozen=True, slots=True)
class AffinityConfig:
    """Where an explicit affinity key (document or conversation id) may come from."""

    header: str | None = "x-kvgate-affinity-key"
    body_field: str | None = None


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    replicas: list[ReplicaConfig] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "round_robin"})
    host: str = "127.0.0.1"
    port: int = 8000
    tokenizer: str | None = None
    admin_token: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    max_attempts: int = 3
    tokenizer_concurrency: int = 4
    tokenizer_memo: int = 2048  # prefix encodings remembered (~10 KB each); 0 = off
    affinity: AffinityConfig = field(default_factory=AffinityConfig)
    tenancy: TenancyConfig = field(default_factory=TenancyConfig)
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)

    def validate(self) -> None:
        _positive(self, "port", "max_body_bytes", "max_attempts", "tokenizer_concurrency")
        if self.tokenizer_memo < 0:
            raise ValueError(f"tokenizer_memo must be >= 0, got {self.tokenizer_memo!r}")
        seen: set[str] = set()
        for i, replica in enumerate(self.replicas):
            if replica.id in seen:
                raise ValueError(f"replicas[{i}].id {replica.id!r} appears twice")
            seen.add(replica.id)
        if "name" not in self.policy:
            raise ValueError("policy.name is required")


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")


def parse_config(data: Any, where: str = "config") -> GatewayConfig:
    return from_mapping(GatewayConfig, data, where)


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a YAML file; errors name the file, the key and the bad value."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    return parse_config(data, where=str(path))
