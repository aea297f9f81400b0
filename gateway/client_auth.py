"""Client API keys: with any configured, every client endpoint (the OpenAI ``/v1/*`` ones
and the pass-throughs: ``/generate``, ``/invocations``, ``/tokenize``, ``/pooling`` ...)
needs ``Authorization: Bearer <key>``, and the key names the client's tenant; only the
probes (``/health``, ``/health_generate``, ``/ping``, ``/ready``, ``/version``) and ``/metrics``
stay open.

Keys come from the YAML, a file or an environment variable (``ClientKey``); requests are
matched against their SHA-256 digests. A key read from a file or variable is not kept once
its digest is made; one written in the YAML stays in the loaded config, as the YAML holds
it. A missing or unknown key gets a 401 in OpenAI's shape (``WWW-Authenticate: Bearer``),
as the engine's key does (:mod:`kvwire.secret_source`).
The client's ``Authorization`` header is the gateway's business then: it is never
forwarded to a replica.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from starlette.requests import Request

from kvwire.secret_source import (
    bearer_token,
    invalid_api_key,
    missing_api_key,
    resolve_bearer,
    resolve_secret,
)

MIN_KEY_CHARS = 16


@dataclass(frozen=True, slots=True)
class ClientKey:
    """One client API key (``key``, or read from ``key_file`` or ``key_env``) and the
    tenant it stands for (None: the anonymous tenant)."""

    key: str | None = None
    key_file: str | None = None
    key_env: str | None = None
    tenant: str | None = None

    def validate(self) -> None:
        self.checked()

    def checked(self) -> str:
        """The key, checked at every read: a file or variable read again when the gateway
        starts may have changed since the config was validated. ValueError for none, one
        too short, or one no header can carry."""
        value = resolve_bearer(self.key, self.key_file, self.key_env, "key", "an api key",
                               MIN_KEY_CHARS)
        if value is None:
            raise ValueError("an api key needs key, key_file or key_env")
        return value

    def resolved(self) -> str | None:
        return resolve_secret(self.key, self.key_file, self.key_env, "key")


def presented_bearer(request: Request) -> str:
    """The token of the request's one ``Authorization: Bearer <token>`` header
    (:func:`kvwire.secret_source.bearer_token`), as text; "" when there is none. BadRequest
    when the header came more than once."""
    return bearer_token(request.headers.raw).decode("latin-1")


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class ClientAuth:
    """Which tenant a request's API key names; off (everyone admitted) with no keys."""

    def __init__(self, keys: list[ClientKey]) -> None:
        self._tenants: dict[bytes, str | None] = {}
        for i, entry in enumerate(keys):
            try:  # read again: its file or variable may have changed since the load
                value = entry.checked()
            except ValueError as exc:
                raise ValueError(f"auth.api_keys[{i}]: {exc}") from None
            self._tenants[_digest(value.encode())] = entry.tenant

    @property
    def on(self) -> bool:
        return bool(self._tenants)

    def tenant_of(self, request: Request) -> str | None:
        """The tenant of the request's key; Unauthorized when the key is missing or
        unknown (only called when ``on``)."""
        key = bearer_token(request.headers.raw)
        if not key:
            raise missing_api_key()
        # looked up by its digest: in no time that depends on how much of a key matched
        digest = _digest(key)
        if digest not in self._tenants:
            raise invalid_api_key()
        return self._tenants[digest]
