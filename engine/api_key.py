"""The engine's API key (``kvgate engine --api-key``, as vLLM's and SGLang's ``--api-key``):
with one set, every route needs ``Authorization: Bearer <key>``, the control endpoints
(``/abort_request``, ``/flush_cache``, ``/reset_prefix_cache``) among them; only
:data:`OPEN_PATHS` (what probes, load balancers and Prometheus reach) stay open. A missing
or wrong key gets a 401 in OpenAI's shape with ``WWW-Authenticate: Bearer`` (the header
sent twice, a 400, as the gateway answers it).

The key comes from the flag, a file (``--api-key-file``) or :data:`API_KEY_ENV`, at most one
of them, read as the gateway reads its secrets (:mod:`kvwire.secret_source`); it is never
logged or printed.
"""

from __future__ import annotations

import hmac
import os
from typing import Any, NamedTuple

import orjson

from kvwire.openai_schema import BadRequest, OpenAIError, Unauthorized
from kvwire.secret_source import resolve_bearer

API_KEY_ENV = "KVGATE_ENGINE_API_KEY"
# answered without a key: health probes, version checks and metric scrapes (vLLM leaves
# these open too)
OPEN_PATHS = frozenset({"/health", "/version", "/metrics"})
_FLAGS = ("--api-key", "--api-key-file", API_KEY_ENV)


def resolve_api_key(key: str | None, key_file: str | None) -> str | None:
    """The key from ``--api-key`` (``key``), ``--api-key-file`` (``key_file``, stripped) or
    the environment's :data:`API_KEY_ENV`; None when none of them is given (no key: every
    route open). ValueError naming the flag, file or variable (never the key) when more
    than one is given, the file cannot be read, the key is empty, or it is one no
    ``Authorization`` header can carry."""
    env = API_KEY_ENV if API_KEY_ENV in os.environ else None
    given = [flag for flag, source in zip(_FLAGS, (key, key_file, env), strict=True)
             if source is not None]
    if len(given) > 1:  # an empty one too: none is left out silently
        raise ValueError(f"{' and '.join(given)} are set: give the API key in one place")
    resolved = resolve_bearer(key, key_file, env, "API key", "the API key", labels=_FLAGS)
    if resolved is None and given:  # given, but empty: not taken for no key at all
        where = f"--api-key-file {key_file!r} holds no key" if key_file is not None \
            else f"{given[0]} is empty"
        raise ValueError(f"{where}: give the API key, or none of --api-key, --api-key-file "
                         f"and {API_KEY_ENV} to serve without one")
    return resolved


class _Refusal(NamedTuple):
    """An answer refusing a request, encoded once: sent as fresh ASGI messages."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes

    @classmethod
    def of(cls, err: OpenAIError) -> _Refusal:
        body = orjson.dumps(err.body())
        headers: tuple[tuple[bytes, bytes], ...] = (
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()))
        if err.status == 401:  # RFC 9110: a 401 names the scheme that would be admitted
            headers += ((b"www-authenticate", b"Bearer"),)
        return cls(err.status, headers, body)

    async def send(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status,
                    "headers": list(self.headers)})
        await send({"type": "http.response.body", "body": self.body})


_MISSING = _Refusal.of(Unauthorized("an API key is required: 'Authorization: Bearer <key>'",
                                    code="missing_api_key"))
_INVALID = _Refusal.of(Unauthorized("the API key is not valid", code="invalid_api_key"))


class ApiKeyGate:
    """ASGI layer admitting an HTTP request to ``app`` only with ``Authorization: Bearer
    <key>`` (the scheme in any case, compared in constant time), or on one of
    :data:`OPEN_PATHS`; other scopes (lifespan) pass. Reads the raw header from the scope:
    no request object is built, and a refusal's body is encoded once."""

    def __init__(self, app: Any, key: str) -> None:
        if not key:
            raise ValueError("the API key is empty")
        self.app = app
        self._key = key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            refusal = self._refusal(scope["headers"])
            if refusal is not None:
                await refusal.send(send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, headers: list[tuple[bytes, bytes]]) -> _Refusal | None:
        """The answer refusing a request with these headers; None to admit it."""
        values = [value for name, value in headers if name == b"authorization"]
        if not values:
            return _MISSING
        if len(values) > 1:  # which one a proxy in front read is not known (RFC 9110)
            return _Refusal.of(BadRequest(f"header 'authorization' was sent {len(values)} "
                                          "times; send it once",
                                          code="repeated_authorization"))
        scheme, _, token = values[0].partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return _MISSING
        if not hmac.compare_digest(token.strip(), self._key):
            return _INVALID
        return None
