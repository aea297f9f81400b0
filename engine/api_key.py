"""The engine's API key (``kvgate engine --api-key``, as vLLM's and SGLang's ``--api-key``):
with one set, every route needs ``Authorization: Bearer <key>``, the control endpoints
(``/abort_request``, ``/flush_cache``, ``/reset_prefix_cache``) among them; only
:data:`OPEN_PATHS` (what probes, load balancers and Prometheus reach) stay open. A missing
or wrong key gets a 401 in OpenAI's shape with ``WWW-Authenticate: Bearer`` (the header
sent twice, a 400), as the gateway answers a client's key (:mod:`kvwire.secret_source`).

The key comes from the flag, a file (``--api-key-file``) or :data:`API_KEY_ENV`, at most one
of them, read as the gateway reads its secrets (:mod:`kvwire.secret_source`); it is never
logged or printed.
"""

from __future__ import annotations

import hmac
import os
from typing import Any

from starlette.requests import Request

from kvwire.openai_schema import OpenAIError
from kvwire.request_edge import ErrorBoundary
from kvwire.secret_source import bearer_token, invalid_api_key, missing_api_key, resolve_bearer

API_KEY_ENV = "KVGATE_ENGINE_API_KEY"
# answered without a key: health probes, version checks and metric scrapes (vLLM leaves
# these open too)
OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})
_FLAGS = ("--api-key", "--api-key-file", API_KEY_ENV)


def resolve_api_key(key: str | None, key_file: str | None) -> str | None:
    """The key from ``--api-key`` (``key``), ``--api-key-file`` (``key_file``, stripped) or
    the environment's :data:`API_KEY_ENV` (stripped); None when none of them is given (no
    key: every route open). ValueError naming the flag, file or variable (never the key)
    when more than one is given (an empty one too), the file cannot be read, the key is
    empty (given, it is not taken for no key at all), or it is one no ``Authorization``
    header can carry."""
    env = API_KEY_ENV if API_KEY_ENV in os.environ else None
    return resolve_bearer(key, key_file, env, "key", "the API key", labels=_FLAGS,
                          empty_refused=True)


class ApiKeyGate:
    """ASGI layer admitting an HTTP request to ``app`` only with ``Authorization: Bearer
    <key>`` (the scheme in any case, compared in constant time), or on one of
    :data:`OPEN_PATHS`; other scopes (lifespan) pass. Reads the raw header from the scope:
    no request object is built for a request it admits. A refusal is answered as the
    engine's other errors are (``ErrorBoundary``)."""

    def __init__(self, app: Any, key: str) -> None:
        if not key:
            raise ValueError("the API key is empty")
        self.app = app
        self._key = key.encode()
        self._boundary = ErrorBoundary()  # as the engine app's: no counter, no tag

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            try:
                self._check(scope["headers"])
            except OpenAIError as exc:
                refusal = self._boundary.response(Request(scope), exc)
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Nothing when these headers present the key; else the error refusing them."""
        token = bearer_token(headers)
        if not token:
            raise missing_api_key()
        if not hmac.compare_digest(token, self._key):
            raise invalid_api_key()
