"""The gateway's YAML configuration, validated strictly on load.

Example (every key but ``replicas`` has a default)::

    host: 127.0.0.1
    port: 8000
    tokenizer: null              # directory or tokenizer.json; null = project tokenizer
    tokenizer_concurrency: 4     # prompts encoded at once, off the event loop
    tokenizer_memo: 2048         # prefix encodings remembered; 0 = off
    unlisted_model: refuse       # a model no replica lists: 404 (pass: to the one base
                                 # model's replicas, body unchanged, as SGLang serves any)
    admin: {token_env: KVGATE_ADMIN_TOKEN, host: 127.0.0.1, port: 8001,
            allow_hosts: [], allow_networks: [10.0.0.0/8]}   # off without a token
            # a secret X (token, secret, key) is given as X, X_file or X_env
    max_body_bytes: 16777216     # an inline image or two
    max_attempts: 3              # replicas a request is tried on before its first byte
    access_log: false            # one JSON line per request (kvgate.access)
    cors: {allow_origins: [], allow_credentials: false}   # browsers: off unless named
    affinity: {header: x-kvgate-affinity-key, body_field: null}
    tenancy: {isolate: false, header: x-kvgate-tenant, secret_env: KVGATE_TENANT_SECRET,
              require_tenant: false, client_salt: replace,
              partitions: [{tenants: [acme], replicas: [r2]}]}
    trusted_proxies: [10.0.0.0/8]  # whose X-Forwarded-For and tenant header are believed
    auth: {api_keys: [{key_env: ACME_API_KEY, tenant: acme}]}  # none: client endpoints are open
    shutdown: {grace_s: 5, timeout_s: 30}
    policy: {name: cost}         # or {name: prefix_affinity, prefix_tokens: 1024, ...}
    replicas:
      - {id: r0, url: "http://127.0.0.1:8101"}
      - {id: r1, url: "http://127.0.0.1:8102", weight: 2, api_key_env: VLLM_API_KEY}
      - {id: r2, url: "http://127.0.0.1:8103", kv_events: "tcp://127.0.0.1:5557"}
    limits: {max_in_flight: 1024, max_pending: 0, max_pending_s: 30,
             max_queued_tokens_per_replica: null, held_back_margin: 8,
             connections_per_replica: 256,
             max_connections: 4096, keep_alive_s: 75, max_header_bytes: 65536,
             header_timeout_s: 10, body_timeout_s: 60, max_receiving_bytes: 268435456,
             max_held_body_bytes: 1073741824}
    timeouts: {connect_s: 2, first_byte_s: 600, stream_first_byte_s: null, stall_s: 30,
               idle_s: 60, buffer_bytes: 1048576}
               # times are seconds: timeouts at least 0.001, health and scrape
               # intervals (interval_s, models_refresh_s) at least 0.01
    health: {interval_s: 2, timeout_s: 1, failures_to_eject: 2, successes_to_readmit: 1,
             request_failures_to_eject: 3, ejection_s: 10, models_refresh_s: 30,
             path: /health}   # what a check asks each replica for (a 200 is healthy)
    scrape: {enabled: true, interval_s: 1, timeout_s: 1, hit_rate_window_s: 60,
             stale_after_failures: 3,
             max_bytes: 8388608,
             kv_capacity_estimate: {enabled: true, min_samples: 3, window: 64,
                                    decay: 0.97, usage_floor: 0.02, outlier: 0.35}}
    discovery: [{type: dns, name: vllm-headless.llm.svc.cluster.local, port: 8000},
                {type: kubernetes, namespace: llm, service: vllm, port_name: http}]
                # replicas found at run time, next to ``replicas`` (gateway.discovery.config)
    tracing: {enabled: false, service_name: kvgate, exporter: otlp, endpoint: null,
              sample_ratio: 1.0}   # OpenTelemetry spans; needs the otel extra
    capture: {path: null, sample_rate: 1.0, max_mb: 256,   # JSONL for kvgate audit
              queue: 1024, queue_mb: 64}
    prefix_report: {enabled: false, recent_requests: 512, max_mb: 32}
    tls: {ca_file: /etc/kvgate/replica-ca.pem}  # https replicas: trusted beside the
                                                 # system's CAs; verification is always on
    peers: {listen: "0.0.0.0:8002", addresses: ["kvgate-peers.llm.svc:8002"],
            secret_env: KVGATE_PEER_SECRET,   # gateway copies share what they route
            resolve_s: 10, queue_frames: 4096, queue_bytes: 16777216, pending_s: 600,
            tell_responses: true}
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gateway.capture import CaptureConfig, PrefixReportConfig
from gateway.client_auth import ClientKey
from gateway.data_parallel import MAX_RANKS, group_of, names_rank, rank_endpoint, rank_id
from gateway.discovery.config import DiscoverySourceConfig
from gateway.kv_capacity_estimate import CapacityEstimateConfig
from gateway.least_seconds import LEAST_INTERVAL_S, LEAST_TIMEOUT_S, at_least
from gateway.peer_config import PeersConfig, split_address
from gateway.tenancy import TenancyConfig
from gateway.tracing import TracingConfig
from kvwire import yaml_strict
from kvwire.media_parts import shown
from kvwire.secret_source import resolve_bearer
from policies.config import ConfigError, from_mapping

MAX_WEIGHT = 100.0  # a replica's weight: a share relative to the others'
MAX_URL_CHARS = 2048  # a replica's URL, base path included
MIN_TOKEN_CHARS = 16  # the admin token's

_REPLICA_ID = re.compile(r"[A-Za-z0-9._:@\[\]-]{1,253}")


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    id: str
    url: str
    weight: float = 1.0
    kv_events: str | None = None  # the replica's KV event PUB endpoint (policy kv_events)
    kv_events_replay: str | None = None  # ... and its replay (ROUTER) endpoint
    # KV capacity in the replica's tokens, for replicas whose /metrics tell none
    kv_capacity_tokens: int | None = None
    # the replica's own API key (vLLM --api-key), sent to it as "Authorization: Bearer":
    # for requests, /health, /metrics and /v1/models
    api_key: str | None = None
    api_key_file: str | None = None
    api_key_env: str | None = None
    # the data-parallel ranks behind its one API server (vLLM --data-parallel-size, SGLang
    # --dp-size): one member of the fleet per rank (gateway.data_parallel)
    data_parallel_size: int = 1
    data_parallel_rank: int | None = None  # set on each rank's own config (``ranks``)

    def validate(self) -> None:
        if not _REPLICA_ID.fullmatch(self.id):
            raise ValueError(f"replica id {self.id!r:.80} must be 1-253 characters of letters, "
                             "digits and . _ : @ [ ] - (it is a metric label and a path "
                             "segment of the admin API)")
        self.resolved_api_key()  # a file or variable that cannot be read is named now
        url = shown_url(self.url)
        if len(self.url) > MAX_URL_CHARS:
            raise ValueError(f"url {url} is {len(self.url):,} characters long, past the "
                             f"{MAX_URL_CHARS:,} a replica URL may have")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url} is not an http(s) URL")
        if parts.query or parts.fragment or "@" in parts.netloc or "?" in self.url \
                or "#" in self.url:
            raise ValueError(f"url {url} must be scheme://host[:port][/base path], "
                             "without credentials, query or fragment")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"url {url} has a bad port") from None
        if port == 0:
            raise ValueError(f"url {url} has port 0, which cannot be connected to")
        path = parts.path.rstrip("/")
        if path.rpartition("/")[2] == "v1":  # an OpenAI client's base_url, not a replica's
            fixed = shown_url(self.url.rstrip("/").removesuffix("/v1"))
            raise ValueError(
                f"url {url} of replica {self.id!r} ends in /v1, which the gateway adds "
                f"itself: it would send /v1/chat/completions to {path}/v1/chat/completions "
                f"and check {path}/health; write the replica's address without it, {fixed}")
        if not 0 < self.weight <= MAX_WEIGHT:
            raise ValueError(f"weight must be > 0 and at most {MAX_WEIGHT:g} (a relative "
                             f"share: a ring holds vnodes x weight points), got {self.weight!r}")
        self._check_ranks()
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens!r}")
        for key in ("kv_events", "kv_events_replay"):
            value = getattr(self, key)
            if value is None:
                continue
            if not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"{key} {shown(value)} is not a tcp://, ipc:// or inproc:// "
                                 "endpoint")
            endpoint_port = value.rpartition(":")[2]
            # ZMQ takes a connect to port 0 and then waits on it for ever
            if value.startswith("tcp://") and endpoint_port.isdigit() \
                    and int(endpoint_port) == 0:
                raise ValueError(f"{key} {shown(value)} has port 0, which cannot be connected to")
        if self.data_parallel_rank is None:
            _check_endpoints_apart(self, self.ranks())

    def _check_ranks(self) -> None:
        size, rank = self.data_parallel_size, self.data_parallel_rank
        if type(size) is not int or not 1 <= size <= MAX_RANKS:
            raise ValueError(f"data_parallel_size must be an integer from 1 to {MAX_RANKS}, "
                             f"got {size!r}")
        named = names_rank(self.id)
        if rank is None:
            if named is not None:  # ids of that form are the ranks' own
                raise ValueError(f"replica id {self.id!r} ends like a data-parallel rank's "
                                 "(.dp<number>): choose another")
            if size > 1:  # its last rank's: the longest id, the event ports offset most
                self.ranks()[-1].validate()
        elif type(rank) is not int or not 0 <= rank < size or named != rank:
            raise ValueError(f"data_parallel_rank {rank!r} is no rank of replica {self.id!r} "
                             f"of data_parallel_size {size}")

    def event_endpoints(self) -> list[tuple[str, str]]:
        """Its KV event endpoints as ``(endpoint, key)``: publish, then replay."""
        return [(value, key) for key in ("kv_events", "kv_events_replay")
                if (value := getattr(self, key)) is not None]

    def ranks(self) -> list[ReplicaConfig]:
        """The fleet members of this replica: one per data-parallel rank, each with its
        rank's id and KV event endpoints (``gateway.data_parallel``); itself when it has
        one rank, or is a rank's."""
        if self.data_parallel_size == 1 or self.data_parallel_rank is not None:
            return [self]
        return [replace(self, id=rank_id(self.id, k), data_parallel_rank=k,
                        kv_events=None if self.kv_events is None
                        else rank_endpoint(self.kv_events, k),
                        kv_events_replay=None if self.kv_events_replay is None
                        else rank_endpoint(self.kv_events_replay, k))
                for k in range(self.data_parallel_size)]

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/")

    def resolved_api_key(self) -> str | None:
        """The key as its value, file or variable holds it now, checked as a bearer token
        each time (a file may have changed since the config was loaded)."""
        return resolve_bearer(self.api_key, self.api_key_file, self.api_key_env, "api_key",
                              "api_key")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """How the gateway checks its ``https`` replicas' certificates: against the system's
    CAs and, where set, the PEM certificates in ``ca_file`` (a private CA's, for replicas
    addressed by pod IP), for proxied requests, health checks, scrapes, model lists and
    stored responses alike. Verification cannot be turned off."""

    ca_file: str | None = None

    def validate(self) -> None:
        if self.ca_file is None:
            return
        if not self.ca_file:
            raise ValueError("ca_file '' names no file")
        try:  # read now, so that a missing or unusable file is named at load
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=self.ca_file)
        except ssl.SSLError:  # (an OSError too)
            raise ValueError(f"ca_file {shown(self.ca_file, 300)} holds no PEM certificate") \
                from None
        except OSError as exc:
            raise ValueError(f"ca_file {shown(self.ca_file, 300)} cannot be read: "
                             f"{exc.strerror or exc}") from None


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    """``first_byte_s`` bounds the wait for any answer's first byte, over every replica
    tried; a streamed one's wait per replica is learned from recent first tokens unless
    ``stream_first_byte_s`` fixes it; where no wait is learned (a non-streamed answer, the
    first streams), a replica whose scrapes show it is not working is left after
    ``stall_s`` (see ``gateway.first_byte``)."""

    connect_s: float = 2.0
    first_byte_s: float = 600.0  # the openai client's own default timeout
    stream_first_byte_s: float | None = None
    stall_s: float = 30.0
    idle_s: float = 60.0
    buffer_bytes: int = 1 << 20  # a non-streamed answer up to this size is read whole first

    def validate(self) -> None:
        _positive(self, "buffer_bytes")
        at_least(self, LEAST_TIMEOUT_S, "connect_s", "first_byte_s", "stall_s", "idle_s")
        if self.stream_first_byte_s is not None:
            at_least(self, LEAST_TIMEOUT_S, "stream_first_byte_s")


_MAX_HEALTH_PATH = 256
DEFAULT_HEALTH_PATH = "/health"


@dataclass(frozen=True, slots=True)
class HealthConfig:
    interval_s: float = 2.0
    timeout_s: float = 1.0
    failures_to_eject: int = 2
    successes_to_readmit: int = 1
    models_refresh_s: float = 30.0
    # requests failing in a row (5xx, first-byte timeout, cut) that eject a replica, and
    # how long it stays out before a health check may readmit it (doubling each time it is
    # ejected again soon after, up to 32x)
    request_failures_to_eject: int = 3
    ejection_s: float = 10.0
    # what a check asks for (a 200 is healthy): vLLM's, SGLang's, TGI's, llama.cpp's and
    # the engine's /health (where it answers 404, as Ollama's, /v1/models is asked); another
    # server's own (SGLang's /health_generate runs a token)
    path: str = DEFAULT_HEALTH_PATH

    def validate(self) -> None:
        _positive(self, "failures_to_eject", "successes_to_readmit",
                  "request_failures_to_eject")
        if not (self.path.startswith("/") and len(self.path) <= _MAX_HEALTH_PATH
                and self.path.isprintable() and " " not in self.path):
            raise ValueError(f"health.path must be a path on the replica's server that "
                              f"starts with / (no spaces, at most {_MAX_HEALTH_PATH} "
                              f"characters), got {self.path!r}")
        at_least(self, LEAST_INTERVAL_S, "interval_s", "models_refresh_s")
        at_least(self, LEAST_TIMEOUT_S, "timeout_s", "ejection_s")


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    interval_s: float = 1.0
    timeout_s: float = 1.0
    hit_rate_window_s: float = 60.0
    enabled: bool = True
    # scrapes failing in a row after which a replica's last load figures are dropped
    # (routing then counts only what this gateway sent it), and a page's size bound
    stale_after_failures: int = 3
    max_bytes: int = 8 << 20
    # capacity from kv_cache_usage_perc, for replicas whose /metrics tell none
    kv_capacity_estimate: CapacityEstimateConfig = field(
        default_factory=CapacityEstimateConfig)

    def validate(self) -> None:
        _positive(self, "stale_after_failures", "max_bytes")
        at_least(self, LEAST_INTERVAL_S, "interval_s")
        at_least(self, LEAST_TIMEOUT_S, "timeout_s", "hit_rate_window_s")


@dataclass(frozen=True, slots=True)
class CorsConfig:
    """Cross-origin requests from browsers: off unless origins are named (``["*"]``: any,
    as vLLM's server allows by default); ``allow_credentials`` lets them send cookies."""

    allow_origins: list[str] = field(default_factory=list)
    allow_credentials: bool = False

    def validate(self) -> None:
        if self.allow_credentials and "*" in self.allow_origins:
            raise ValueError("allow_credentials needs named origins, not '*'")


@dataclass(frozen=True, slots=True)
class AdminConfig:
    """The admin API (``/admin/*``): served only on its own listener, ``host:port``
    (loopback by default), and only when a token is configured (``token``, or read from
    ``token_file`` or the environment variable ``token_env``); every call then needs
    ``Authorization: Bearer <token>``. Replicas it adds must have a URL whose host is in
    ``allow_hosts`` (names, in any case: host names are case-insensitive) or an address
    in ``allow_networks``; client
    ``Authorization`` headers are never forwarded to them."""

    token: str | None = None
    token_file: str | None = None
    token_env: str | None = None
    host: str = "127.0.0.1"
    port: int = 8001
    allow_hosts: list[str] = field(default_factory=list)
    allow_networks: list[str] = field(default_factory=list)

    def validate(self) -> None:
        _positive(self, "port")
        _networks("allow_networks", self.allow_networks)
        self.resolved_token()

    def resolved_token(self) -> str | None:
        """The token from wherever it is configured (None: the admin API is off), checked
        at every read: a file or variable read again at start-up may have changed since
        the config was validated. ValueError for one too short or no header can carry."""
        return resolve_bearer(self.token, self.token_file, self.token_env, "token",
                              "the admin token", MIN_TOKEN_CHARS)

    def allows(self, url: str) -> bool:
        """Whether a replica at ``url`` may be added through the admin API."""
        host = urlsplit(url).hostname or ""  # (lower case, as urlsplit gives it)
        if any(host == allowed.lower() for allowed in self.allow_hosts):
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False  # a name not listed: never resolved here
        return any(address in ipaddress.ip_network(n, strict=False)
                   for n in self.allow_networks)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """Client API keys (``gateway.client_auth``); none: every client endpoint is open."""

    api_keys: list[ClientKey] = field(default_factory=list)

    def validate(self) -> None:
        """One key names one tenant: a key listed twice (for two tenants, the last
        would win unseen) is refused, naming the entries, never the key."""
        first: dict[str, int] = {}
        for i, entry in enumerate(self.api_keys):
            value = entry.resolved()
            if value in first:
                j = first[value]
                raise ValueError(f"api_keys[{i}] (tenant {entry.tenant!r}) has the same key as "
                                 f"api_keys[{j}] (tenant {self.api_keys[j].tenant!r})")
            if value is not None:
                first[value] = i


@dataclass(frozen=True, slots=True)
class ShutdownConfig:
    """On SIGTERM: ``/ready`` answers 503 at once, requests are still served for
    ``grace_s`` (load balancers notice), then the server stops taking new ones and lets
    those in flight finish, exiting within ``timeout_s`` of the signal."""

    grace_s: float = 5.0
    timeout_s: float = 30.0

    def validate(self) -> None:
        if self.grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {self.grace_s!r}")
        if not self.timeout_s > self.grace_s:
            raise ValueError(f"timeout_s must be > grace_s, got {self.timeout_s!r}")


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """What the gateway takes on before it answers 429 (with ``Retry-After``).

    ``max_in_flight``: requests being answered at once; past it a request waits for one
    to end only while ``max_pending`` others wait (at most ``max_pending_s``), else gets
    its 429 at once. ``max_queued_tokens_per_replica``: a replica whose queued prompt
    tokens (as routing sees them) reach it takes no new request; when every ranked one
    is there, 429. The server side: ``max_connections`` open connections (past it a new
    connection is answered 503 and closed; those open are served), ``keep_alive_s`` for
    idle ones, ``max_header_bytes`` per request head (431) received within
    ``header_timeout_s`` (408), a body within ``body_timeout_s`` (408), all bodies still
    being received within ``max_receiving_bytes`` (429; a body is read before its
    request takes one of the ``max_in_flight`` places, and a request that would find no
    place is refused as soon as its body is read, before it is decoded), and the bodies
    read whole, each held by its request until its answer ends, within
    ``max_held_body_bytes`` (429). A connection
    closed with its answer unsent is dropped once its client reads none of it for
    ``header_timeout_s``. Toward each replica at most
    ``connections_per_replica`` connections.
    """

    max_in_flight: int = 1024
    max_pending: int = 0
    max_pending_s: float = 30.0
    max_queued_tokens_per_replica: int | None = None
    # a replica holding at least twice the fleet's median requests in flight plus this many
    # is tried after the others (``gateway.held_back``: one whose requests stall or crawl
    # after their first byte drew nearly every request); null: the policy's order stands
    held_back_margin: int | None = 8
    connections_per_replica: int = 256
    max_connections: int = 4096
    # longer than the idle timeouts of what usually stands in front (load balancers close
    # idle connections after 60 s by default, client pools sooner): a server that closes
    # an idle connection first races the client's next request on it, which then fails
    # unanswered (a POST is not sent again); idle connections count in max_connections
    keep_alive_s: float = 75.0
    max_header_bytes: int = 65536
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # bytes of request bodies still being received, all requests together: a body is read
    # before its request takes a place, so a client that sends a head and no body holds
    # none; past this, 429
    max_receiving_bytes: int = 256 * 1024 * 1024
    # bytes of the request bodies read whole, all requests together, each counted until its
    # request's answer ends (relayed, failed, refused, or its client gone); past this, 429.
    # The process holds about three times this: a body's decoded forms (parsed, the prompt
    # routed by) stay with it (255 chat bodies of 4 MiB waiting on a slow replica, 1 GiB:
    # 3.2 GiB resident)
    max_held_body_bytes: int = 1024 * 1024 * 1024

    def validate(self) -> None:
        _positive(self, "max_in_flight", "connections_per_replica", "max_connections",
                  "max_header_bytes", "max_receiving_bytes", "max_held_body_bytes")
        at_least(self, LEAST_TIMEOUT_S, "max_pending_s", "keep_alive_s", "header_timeout_s",
                 "body_timeout_s")
        if self.max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {self.max_pending!r}")
        if self.max_queued_tokens_per_replica is not None:
            _positive(self, "max_queued_tokens_per_replica")
        if self.held_back_margin is not None:
            _positive(self, "held_back_margin")


@dataclass(frozen=True, slots=True)
class AffinityConfig:
    """Where an explicit affinity key (document or conversation id) may come from."""

    header: str | None = "x-kvgate-affinity-key"
    body_field: str | None = None

    def __post_init__(self) -> None:
        # in lower case, as ASGI gives a request's header names: looked up per request
        if self.header:
            object.__setattr__(self, "header", self.header.lower())


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    replicas: list[ReplicaConfig] = field(default_factory=list)
    discovery: list[DiscoverySourceConfig] = field(default_factory=list)
    policy: dict[str, Any] = field(default_factory=lambda: {"name": "cost"})
    host: str = "127.0.0.1"
    port: int = 8000
    tokenizer: str | None = None
    admin: AdminConfig = field(default_factory=AdminConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    shutdown: ShutdownConfig = field(default_factory=ShutdownConfig)
    # networks of the proxies in front of the gateway: their X-Forwarded-For, Forwarded
    # and (under tenancy.isolate or with partitions) tenant header are believed
    trusted_proxies: list[str] = field(default_factory=list)
    max_body_bytes: int = 16 * 1024 * 1024
    max_attempts: int = 3
    tokenizer_concurrency: int = 4
    # prefix encodings remembered (~10 KB each), and a quarter as many prefixes of whole
    # prompts (up to 32 KB each: policies that read every token); 0 = off
    tokenizer_memo: int = 2048
    access_log: bool = False  # one JSON line per request on the kvgate.access logger
    # a request naming a model no replica lists: ``refuse`` answers 404 ``model_not_found``
    # naming the models served; ``pass`` sends it, body unchanged, to the replicas of the
    # fleet's one base model where they serve one alone (they answer the name as without
    # the gateway: SGLang and TGI serve any, as their examples' "default" and "tgi"; vLLM
    # answers its own 404); a fleet of several models refuses it either way
    unlisted_model: str = "refuse"
    affinity: AffinityConfig = field(default_factory=AffinityConfig)
    tenancy: TenancyConfig = field(default_factory=TenancyConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    cors: CorsConfig = field(default_factory=CorsConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    # request bodies kept for the prompt-layout audit (gateway.capture)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    prefix_report: PrefixReportConfig = field(default_factory=PrefixReportConfig)
    # the other gateway copies in front of this fleet (gateway.peers); off by default
    peers: PeersConfig = field(default_factory=PeersConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)

    def validate(self) -> None:
        if self.limits.max_receiving_bytes < self.max_body_bytes:
            raise ValueError(f"limits.max_receiving_bytes ({self.limits.max_receiving_bytes}) "
                             f"must be at least max_body_bytes ({self.max_body_bytes}): a "
                             "body that long could never be received")
        if self.limits.max_held_body_bytes < self.max_body_bytes:
            raise ValueError(f"limits.max_held_body_bytes ({self.limits.max_held_body_bytes}) "
                             f"must be at least max_body_bytes ({self.max_body_bytes}): a "
                             "body that long could never be served")
        _positive(self, "port", "max_body_bytes", "max_attempts", "tokenizer_concurrency")
        if self.unlisted_model not in ("pass", "refuse"):
            raise ValueError(f"unlisted_model must be 'pass' or 'refuse', got "
                             f"{self.unlisted_model!r}")
        if self.tokenizer_memo < 0:
            raise ValueError(f"tokenizer_memo must be >= 0, got {self.tokenizer_memo!r}")
        seen: set[str] = set()
        groups: set[str] = set()  # the configured ids: a replica's, or its ranks' group
        for i, replica in enumerate(self.replicas):
            if replica.data_parallel_rank is not None:
                raise ValueError(f"replicas[{i}].data_parallel_rank is set by the gateway on "
                                 "each rank of a replica; give the replica "
                                 "data_parallel_size instead")
            if replica.id in groups:  # ``a`` beside ``a`` of ranks: one DELETE, two replicas
                raise ValueError(f"replicas[{i}].id {replica.id!r} appears twice")
            groups.add(replica.id)
            for member in replica.ranks():
                if member.id in seen:
                    raise ValueError(f"replicas[{i}].id {member.id!r} appears twice")
                seen.add(member.id)
        self._check_endpoints()
        self._check_listeners()
        labels = [source.label for source in self.discovery]
        for i, label in enumerate(labels):
            if label in labels[:i]:
                raise ValueError(f"discovery[{i}] ({label}) appears twice")
        if "name" not in self.policy:
            raise ValueError("policy.name is required")
        _networks("trusted_proxies", self.trusted_proxies)
        if (self.tenancy.isolate or self.tenancy.partitions) and not self.trusted_proxies \
                and not self.auth.api_keys:
            what = "tenancy.isolate" if self.tenancy.isolate else "tenancy.partitions"
            raise ValueError(f"{what} believes the tenant header only from trusted_proxies: "
                             "list the networks of the proxies that set it (or give clients "
                             "API keys that name their tenants: auth.api_keys)")
        if self.tenancy.require_tenant:
            for i, entry in enumerate(self.auth.api_keys):
                if not entry.tenant:  # a key's tenant is the only one its requests have
                    raise ValueError(f"auth.api_keys[{i}] names no tenant, and "
                                     "tenancy.require_tenant refuses every request "
                                     "without one: give it a tenant")
        unknown = self.unknown_partition_replicas()
        if unknown and not self.replicas_join_later():
            known = ", ".join(repr(r.id) for r in self.replicas) or "none"
            raise ValueError(f"tenancy.partitions name unknown replicas "
                             f"{', '.join(map(repr, unknown))} (the replicas are {known}); "
                             "with no discovery and no admin API to add them, their tenants "
                             "could never be served")

    def _check_endpoints(self) -> None:
        """Each KV event endpoint (publish or replay, of each data-parallel rank) named by
        one replica alone: two replicas following one engine's endpoint would both mirror
        its cache (the other engine's never seen), and a subscriber on a replay endpoint
        never speaks with it (ZMQ drops the connection, again and again)."""
        held: dict[str, tuple[str, str]] = {}  # endpoint -> its holder, as named; key
        for i, replica in enumerate(self.replicas):
            members = replica.ranks()  # (within one replica: ReplicaConfig's check)
            named = f"replicas[{i}] ({{id}})"
            clash = endpoint_clash(members, held, named)
            if clash is not None:
                raise ValueError(clash)
            held.update(held_endpoints(members, named))

    def _check_listeners(self) -> None:
        """The peers' listener on a port of its own: on the gateway's (or the admin API's),
        with worker processes (SO_REUSEPORT), the kernel would share the port's clients
        between the two servers without a word."""
        if self.peers.listen is None:
            return
        _, port = split_address(self.peers.listen, "listen", any_port=True)
        taken = {self.port: "port", self.admin.port: "admin.port"}
        if port in taken:
            raise ValueError(f"peers.listen {self.peers.listen!r} is on the gateway's "
                             f"{taken[port]} ({port}): give the peers a port of their own")

    def unknown_partition_replicas(self) -> list[str]:
        """Replica ids ``tenancy.partitions`` name that no configured replica has (one that
        discovery or the admin API adds may take them later), in the order named."""
        ids = {replica.id for replica in self.replicas} \
            | {member.id for member in self.fleet_replicas()}
        named = (r for part in self.tenancy.partitions for r in part.replicas)
        return [r for r in dict.fromkeys(named) if r not in ids]

    def fleet_replicas(self) -> list[ReplicaConfig]:
        """The fleet's members from ``replicas``: each data-parallel rank its own."""
        return [member for replica in self.replicas for member in replica.ranks()]

    def replicas_join_later(self) -> bool:
        """Whether replicas may join after start-up: through discovery or the admin API."""
        return bool(self.discovery) or self.admin.resolved_token() is not None


def held_endpoints(members: Iterable[ReplicaConfig], named: str = "replica {id}"
                   ) -> dict[str, tuple[str, str]]:
    """The places ``members`` (replicas, or the ranks of one) hold as ``endpoint_clash``
    reads them: place -> (its member as ``named`` names it, given the member's ``id``; its
    key). The places: each KV event endpoint, and each url (as ``server_of`` writes it; a
    data-parallel rank's url is its replica's, named by the replica's id)."""
    held: dict[str, tuple[str, str]] = {}
    for member in members:
        held[server_of(member.url)] = (named.format(id=_replica_of(member)), "url")
        for endpoint, key in member.event_endpoints():
            held[endpoint] = (named.format(id=member.id), key)
    return held


def endpoint_clash(members: Iterable[ReplicaConfig], held: Mapping[str, tuple[str, str]],
                   named: str = "replica {id}") -> str | None:
    """Why ``members`` (a replica's ranks, or the replica) may not join replicas holding
    ``held`` (``held_endpoints``): one of their KV event endpoints, or their url, is
    another replica's; the error names both (a member as ``named`` names it) and the
    endpoint or url. None when none is. Two replicas following one engine's endpoint would
    both mirror its cache (the other engine's never seen), and a subscriber on a replay
    endpoint never speaks with it; one server listed twice is counted as two (its load
    and its cache each seen as two replicas', its requests split between them)."""
    for member in members:
        for endpoint, key in member.event_endpoints():
            holder = held.get(endpoint)
            if holder is not None:
                other, other_key = holder
                return (f"{named.format(id=member.id)} {key} {shown(endpoint)} is also {other}'s "
                        f"{other_key}: each replica's engine publishes on endpoints of its "
                        "own (two replicas following one would both mirror that engine's "
                        "cache)")
        holder = held.get(server_of(member.url))
        if holder is not None:
            return (f"{named.format(id=_replica_of(member))} url {shown_url(member.url)} is "
                    f"also {holder[0]}'s url: one server listed as two replicas would be "
                    "counted twice (its load and its cache each seen as two replicas', its "
                    "requests split between them); list it once")
    return None


def server_of(url: str) -> str:
    """The server a replica's ``url`` names, written one way: scheme and host in lower
    case, the port written (the scheme's when none is), the path without its trailing
    ``/`` (``HTTP://Host:80/`` and ``http://host`` are one server)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # (a url no replica may have: refused by its own checks)
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = port or (443 if parts.scheme.lower() == "https" else 80)
    return f"{parts.scheme.lower()}://{host}:{port}{parts.path.rstrip('/')}"


def _replica_of(member: ReplicaConfig) -> str:
    """The id of the replica ``member`` is (a data-parallel rank's: its replica's)."""
    return member.id if member.data_parallel_rank is None else group_of(member.id)


def _check_endpoints_apart(replica: ReplicaConfig, members: list[ReplicaConfig]) -> None:
    """ValueError naming the endpoint when two of ``replica``'s KV event endpoints, over its
    data-parallel ranks (``members``: itself when it has one), are one: a subscriber on a
    replay endpoint never speaks with it (ZMQ drops the connection, again and again)."""
    owners: dict[str, tuple[str, str]] = {}  # endpoint -> member, key
    for member in members:
        for endpoint, key in member.event_endpoints():
            first = owners.get(endpoint)
            if first is None:
                owners[endpoint] = (member.id, key)
                continue
            other, other_key = first
            if other == member.id:
                raise ValueError(f"{key} {shown(endpoint)} is also its {other_key}: the "
                                 "engine publishes and replays on endpoints of their own")
            size = replica.data_parallel_size
            raise ValueError(
                f"rank {member.id}'s {key} {shown(endpoint)} is also rank {other}'s "
                f"{other_key}: a rank's endpoints are the configured ports plus its rank, "
                f"so kv_events and kv_events_replay must be {size} or more ports apart "
                f"(data_parallel_size {size})")


def shown_url(url: str, limit: int = 120) -> str:
    """``url`` as an error names it: any credentials before its host masked (an error
    goes to the admin API's caller and to logs), and its start only."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return shown(f"{scheme}{sep}{authority}{slash}{path}", limit)


def _networks(name: str, values: list[str]) -> None:
    for net in values:
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ValueError(f"{name}: {net!r} is not a network") from None


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value > 0:  # NaN too
            raise ValueError(f"{name} must be > 0, got {value!r}")
        if name == "port" and value > 65535:
            raise ValueError(f"port must be at most 65535, got {value!r}")


def parse_config(data: Any, where: str = "config") -> GatewayConfig:
    return from_mapping(GatewayConfig, data, where)


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a YAML file; errors name the file, the key and the bad value."""
    path = Path(path)
    try:
        data = yaml_strict.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a YAML file (its bytes are not UTF-8 text)") from None
    except yaml_strict.DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.MarkedYAMLError as exc:  # one line: where the parser stopped, and why
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        why = exc.problem or exc.context or "not YAML"
        if exc.problem and exc.context:
            why += f" ({exc.context}"
            if exc.context_mark is not None:
                why += f" at line {exc.context_mark.line + 1}"
            why += ")"
        raise ConfigError(f"{where}: invalid YAML: {why}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    config = parse_config(data, where=str(path))
    from policies.registry import build_policy  # checked here, to name the file
    build_policy(config.policy, where=f"{path}.policy")
    return config
