"""A fleet of real engine processes behind a real gateway process, as the product runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.support.processes import Process, Processes
from tests.support.servers import free_port

SIM_ENGINE = ("--executor", "sim", "--kv-cache-gib", "1", "--model-name", "sim-llama")
ADMIN_TOKEN = "fleet-admin-token-0123"


@dataclass(frozen=True, slots=True)
class EngineReplica:
    """One engine process: its URL, its gateway id, and its KV event endpoint if it has
    one."""

    id: str
    url: str
    proc: Process
    kv_events: str | None = None
    kv_events_replay: str | None = None


@dataclass(frozen=True, slots=True)
class EngineFleet:
    gateway: str  # the gateway's base URL
    replicas: tuple[EngineReplica, ...]
    admin: str  # the gateway's admin listener's base URL
    admin_headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def replica(self, replica_id: str) -> EngineReplica:
        return next(r for r in self.replicas if r.id == replica_id)


def start_fleet(spawn: Processes, tmp_path: Path, policy: dict[str, object],
                replicas: int = 2, engine: tuple[str, ...] = SIM_ENGINE,
                kv_events: bool = False, **gateway: object) -> EngineFleet:
    """``replicas`` engine processes (``engine`` arguments; with ``kv_events``, each
    publishing KV events on its own ZMQ endpoint and serving replays on another, which the
    gateway subscribes to) behind a gateway process configured with ``policy`` and the
    ``gateway`` keys, its admin API on a port of its own."""
    started = []
    for i in range(replicas):
        port = free_port()
        endpoint = f"tcp://127.0.0.1:{free_port()}" if kv_events else None
        replay = f"tcp://127.0.0.1:{free_port()}" if kv_events else None
        args = ("--kv-events-endpoint", endpoint, "--kv-events-replay-endpoint", replay) \
            if endpoint and replay else ()
        proc = spawn("engine", *engine, "--port", str(port), *args)
        started.append(EngineReplica(f"r{i}", f"http://127.0.0.1:{port}", proc, endpoint,
                                     replay))
    for r in started:
        Processes.wait_ready(r.proc, f"{r.url}/health", 120, ("engine", *engine))
    gport, aport = free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "port": gport, "policy": policy,
        "admin": {"token": ADMIN_TOKEN, "port": aport, "allow_networks": ["127.0.0.0/8"]},
        "shutdown": {"grace_s": 0, "timeout_s": 5},  # no load balancer to tell: stop now
        "replicas": [{"id": r.id, "url": r.url,
                      **({"kv_events": r.kv_events, "kv_events_replay": r.kv_events_replay}
                         if r.kv_events else {})}
                     for r in started],
        "health": {"interval_s": 0.3, "timeout_s": 1, "failures_to_eject": 1},
        "scrape": {"interval_s": 0.3},
        **gateway,
    }))
    gateway_url = f"http://127.0.0.1:{gport}"
    spawn("serve", "--config", str(config), ready_url=f"{gateway_url}/ready")
    return EngineFleet(gateway_url, tuple(started), f"http://127.0.0.1:{aport}")
