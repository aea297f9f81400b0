"""Tenant isolation: one prefix-cache namespace per tenant, through vLLM's ``cache_salt``.

A shared prefix cache leaks through timing: a tenant who gets a fast first token has
learned that someone sent that prefix. With ``tenancy.isolate`` on, the gateway sets every
request's ``cache_salt`` to a keyed hash of the tenant named by the tenant header (and of
any salt the client sent), so no tenant can produce another tenant's salt, and replicas
keep each tenant's blocks apart. This is the one case where the gateway rewrites a
request body; with isolation off, bodies pass through byte for byte.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kvwire.openai_schema import BadRequest


@dataclass(frozen=True, slots=True)
class TenancyConfig:
    isolate: bool = False
    header: str = "x-kvgate-tenant"
    secret: str = ""  # key of the salt hash; set it (and keep it) in production
    require_tenant: bool = False

    def validate(self) -> None:
        if not self.header:
            raise ValueError("header must not be empty")


def tenant_salt(secret: str, tenant: str, client_salt: str | None) -> str:
    """64 hex characters (within vLLM's 128-character limit on ``cache_salt``)."""
    message = f"{len(tenant)}:{tenant}|{client_salt or ''}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def isolate(config: TenancyConfig, tenant: str | None, body: Mapping[str, Any]
            ) -> tuple[bytes, str] | None:
    """The rewritten body and its salt, or None to forward the body unchanged."""
    if not config.isolate:
        return None
    if not tenant:
        if config.require_tenant:
            raise BadRequest(f"header {config.header!r} naming the tenant is required",
                             code="missing_tenant")
        return None
    salt = tenant_salt(config.secret, tenant, body.get("cache_salt"))
    return orjson.dumps({**body, "cache_salt": salt}), salt
