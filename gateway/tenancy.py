"""Tenant isolation: one prefix-cache namespace per tenant, through vLLM's ``cache_salt``,
and optionally replicas of their own.

A shared prefix cache leaks through timing: a tenant who gets a fast first token has
learned that someone sent that prefix. With ``tenancy.isolate`` on, the gateway sets every
request's ``cache_salt`` to a keyed hash (HMAC-SHA256 under a secret of at least 32 bytes)
of its tenant, so no client can produce another tenant's salt and replicas keep each
tenant's blocks apart. A request without a tenant is the anonymous tenant's. A salt the
client sent is mixed in (a sub-namespace of its own tenant's; ``client_salt: replace``) or
refused (``reject``). This is the one case where the gateway rewrites a request body; with
isolation off, bodies pass through byte for byte.

Who the tenant is: the tenant header, believed under isolation or with partitions only
from the gateway's ``trusted_proxies`` (the proxy that authenticates clients and sets it);
from anyone else, or sent twice, the request is refused. ``partitions`` give tenants
replicas of their own: a tenant listed in one is routed only to its replicas, every other
tenant only to the replicas no partition names, so tenants who share no replica cannot
probe each other's cache at all. Gateway-side caches on the request path (the tokenizer
memo) are keyed by the salt, so they leak nothing across tenants either.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request

from gateway.data_parallel import group_of
from gateway.errors import NoReplicaAvailable
from gateway.log_throttle import LogThrottle
from gateway.networks import Networks
from gateway.responses_request import ResponseHome
from kvwire.bounded_memo import BoundedMemo
from kvwire.media_parts import shown
from kvwire.openai_schema import MODEL_SHOWN_CHARS, BadRequest, OpenAIError, check_cache_salt
from kvwire.secret_source import resolve_secret
from policies.base import ReplicaView

log = logging.getLogger("kvgate.tenancy")

MIN_SECRET_BYTES = 32


@dataclass(frozen=True, slots=True)
class Partition:
    tenants: list[str]
    replicas: list[str]

    def validate(self) -> None:
        if not self.tenants or not self.replicas:
            raise ValueError("a partition needs tenants and replicas")


@dataclass(frozen=True, slots=True)
class TenancyConfig:
    isolate: bool = False
    header: str = "x-kvgate-tenant"
    # the salt key: given here, or read from a file or an environment variable
    secret: str = ""
    secret_file: str | None = None
    secret_env: str | None = None
    require_tenant: bool = False
    client_salt: str = "replace"  # a client's own cache_salt: replace (mix in) or reject
    partitions: list[Partition] = field(default_factory=list)

    def validate(self) -> None:
        if not self.header:
            raise ValueError("header must not be empty")
        if self.client_salt not in ("replace", "reject"):
            raise ValueError(f"client_salt must be 'replace' or 'reject', got "
                             f"{self.client_salt!r}")
        seen: set[str] = set()
        for part in self.partitions:
            for tenant in part.tenants:
                if tenant in seen:
                    raise ValueError(f"partitions: tenant {tenant!r} is in two partitions")
                seen.add(tenant)
        if self.require_tenant and not self.isolate:
            # read only with isolate: without it, requests with no tenant were served
            raise ValueError("require_tenant needs isolate: true (requests without a tenant "
                             "are refused only under isolation)")
        if self.isolate:
            self.salt_key()

    def salt_key(self) -> bytes:
        """The secret's bytes, from wherever it is configured, checked at every read: a
        file or variable read again when the gateway starts may have changed since the
        config was validated, and salts keyed by an empty or short secret are ones a
        client can compute. ValueError for one shorter than ``MIN_SECRET_BYTES``."""
        found = resolve_secret(self.secret, self.secret_file, self.secret_env, "secret")
        key = (found or "").encode()
        if len(key) < MIN_SECRET_BYTES:
            raise ValueError(f"isolate needs a secret of at least {MIN_SECRET_BYTES} bytes "
                             f"(secret, secret_file or secret_env); got {len(key)}")
        return key


class UntrustedTenant(OpenAIError):
    status = 403
    type = "permission_error"
    kind = "untrusted_tenant"


TENANT_SHOWN_CHARS = 80  # of a tenant's name in an error: its header may be 64 KiB


def tenant_named(tenant: str | None) -> str:
    """``tenant`` as an error names it: by its start, or as the anonymous tenant."""
    return "the anonymous tenant" if tenant is None else \
        f"tenant {shown(tenant, TENANT_SHOWN_CHARS)}"


def partition_views(views: Sequence[ReplicaView], allowed: Callable[[str], bool] | None,
                    tenant: str | None, model: str | None) -> Sequence[ReplicaView]:
    """``views`` within ``tenant``'s partition (``allowed``; None: all of them);
    NoReplicaAvailable naming the tenant and ``model`` when none is (the partition's
    fault, not the replicas' health)."""
    if allowed is None:
        return views
    inside = [v for v in views if allowed(v.id)]
    if not inside:
        raise NoReplicaAvailable(f"no replica in the partition of {tenant_named(tenant)} "
                                 f"serves model {shown(model, MODEL_SHOWN_CHARS)}")
    return inside


# a response id that another tenant's answer came back under: warned of at most this often
KEPT_LOG_S = 10.0
_kept_log = LogThrottle(KEPT_LOG_S)


def record_home(homes: BoundedMemo[str, ResponseHome], response: str,
                home: ResponseHome, told: bool = False) -> bool:
    """Record ``home`` as where the stored response ``response`` is and whose it is, unless
    ``homes`` holds it as another tenant's already: that record stands (a stored response
    stays its tenant's, though a replica that names a response after the request's id,
    as vLLM does, answered another tenant's request under it), warned of. ``told``: the
    record comes from another worker of the box or a peer copy, which saw the answer
    (one that never learned the response's tenant passes on another's as readily). Whether
    it was recorded (and is to be told to the box's other workers and the peers)."""
    held = homes.get(response, None)
    if held is not None and held.tenant != home.tenant:
        since = _kept_log.due()
        if since is not None:
            more = f" ({since} more in the last {KEPT_LOG_S:g} s)" if since else ""
            log.warning("stored response %s kept as its tenant's: an answer to another "
                        "tenant came back under its id, from replica %s%s%s",
                        shown(response), shown(home.replica),
                        " (told by another worker or peer copy)" if told else "", more)
        return False
    homes.put(response, home)
    return True


def tenant_salt(key: bytes, tenant: str, client_salt: str | None) -> str:
    """64 hex characters (within vLLM's 128-character limit on ``cache_salt``)."""
    message = f"{len(tenant)}:{tenant}|{client_salt or ''}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class Tenancy:
    """``TenancyConfig`` made ready for the request path (key read, networks parsed)."""

    def __init__(self, config: TenancyConfig, trusted: Networks) -> None:
        self.config = config
        self._key = config.salt_key() if config.isolate else b""
        self._trusted = trusted
        self._partition = {t: frozenset(p.replicas) for p in config.partitions
                           for t in p.tenants}
        self._partitioned = frozenset(r for p in config.partitions for r in p.replicas)

    def tenant_of(self, request: Request) -> str | None:
        """The request's tenant from its header, believed only from a peer in
        ``trusted_proxies``: from another, refused under isolation or with partitions,
        else not believed (the request is the anonymous tenant's, and its replica is
        told no tenant). Refused when sent twice."""
        header = self.config.header
        values = request.headers.getlist(header)
        if len(values) > 1:
            raise BadRequest(f"header {header!r} was sent {len(values)} times; send it once",
                             code="repeated_tenant")
        tenant = values[0] if values else None
        if tenant and not self._trusted.peer_of(request):
            if self.config.isolate or self.config.partitions:
                raise UntrustedTenant(f"header {header!r} is accepted only from a trusted "
                                      "proxy", code="untrusted_tenant")
            return None
        return tenant or None

    def allowed(self, tenant: str | None) -> Callable[[str], bool] | None:
        """Whether a replica id may serve ``tenant`` (None: every replica may)."""
        if not self._partition:
            return None
        own = self._partition.get(tenant or "")
        if own is not None:  # a partition naming a replica of several ranks holds them all
            return lambda replica: replica in own or group_of(replica) in own
        shared = self._partitioned
        return lambda replica: replica not in shared and group_of(replica) not in shared

    def isolate(self, tenant: str | None, body: Mapping[str, Any]) -> tuple[bytes, str] | None:
        """The rewritten body and its salt, or None to forward the body unchanged."""
        config = self.config
        if not config.isolate:
            return None
        if not tenant and config.require_tenant:
            raise BadRequest(f"header {config.header!r} naming the tenant is required",
                             code="missing_tenant")
        client = body.get("cache_salt")
        if client is not None and config.client_salt == "reject":
            raise BadRequest("cache_salt is set by the gateway for each tenant; do not send "
                             "it", param="cache_salt", code="cache_salt_not_allowed")
        # the rule a replica holds it to (a pass-through body is not parsed before): else a
        # salt it would refuse went through mixed in, and "" salted as no salt at all
        client = check_cache_salt(client)
        salt = tenant_salt(self._key, tenant or "", client)
        try:
            return orjson.dumps({**body, "cache_salt": salt}), salt
        except orjson.JSONEncodeError as exc:  # nested deeper than it writes (254 levels)
            raise BadRequest(f"request body cannot be forwarded with the tenant's cache "
                             f"salt: {exc}", code="invalid_json") from None

    async def isolate_off_loop(self, tenant: str | None, body: Mapping[str, Any],
                               large: bool) -> tuple[bytes, str] | None:
        """``isolate``, on a worker thread when the body is ``large`` (one parsed on a
        thread: written again with its salt, 16 MiB of small items held the loop 70 ms)
        and isolation is on; else on the loop (with isolation off, nothing is done)."""
        if large and self.config.isolate:
            return await asyncio.to_thread(self.isolate, tenant, body)
        return self.isolate(tenant, body)
