"""The gateway's own errors, on top of the OpenAI error tree in ``kvwire.openai_schema``."""

from __future__ import annotations

import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kvwire.openai_schema import OpenAIError, ServiceUnavailable
from kvwire.request_edge import ErrorBoundary


class NoReplicaAvailable(ServiceUnavailable):
    kind = "no_replica"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, code="no_healthy_replica",
                         headers={"Retry-After": str(retry_after_s)})


class FleetBusy(ServiceUnavailable):
    """Every replica tried answered that it is overloaded (429 or 503)."""

    kind = "fleet_busy"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, code="fleet_busy",
                         headers={"Retry-After": str(retry_after_s)})


class UpstreamError(OpenAIError):
    """Every replica tried failed before sending a first byte."""

    status = 502
    type = "upstream_error"
    kind = "upstream"


class UpstreamTimeout(UpstreamError):
    status = 504
    kind = "upstream_timeout"


# keys of a request's ASGI scope: its ``perf_counter`` at arrival (``Arrival``), and that
# its one ``requests`` sample and access-log line were taken (``counted``)
ARRIVED = "kvgate.arrived"
COUNTED = "kvgate.counted"


def counted(request: Request) -> None:
    """Mark ``request`` as counted: its handler took its one ``requests`` sample (the
    boundary then does not count its error answer again)."""
    request.scope[COUNTED] = True


class CountingBoundary(ErrorBoundary):
    """The gateway's error boundary (``ErrorBoundary``: an OpenAI error answer, counted by
    kind), for which every error answer also ends a request: ``refused(request, status,
    arrived)``, unless the request's handler counted it already (``counted``). So a
    refusal no handler counts (a key refused on ``/v1/models``, an admin call refused, a
    path or method the gateway does not serve) is in ``kvgate_requests_total`` and the
    access log as every other answer is, and no answer twice."""

    def __init__(self, count: Callable[[str], None],
                 tag: Callable[[Request], dict[str, str]],
                 refused: Callable[[Request, str, float], None]) -> None:
        super().__init__(count, tag)
        self.refused = refused

    def response(self, request: Request, exc: BaseException) -> Response:
        response = super().response(request, exc)
        if not request.scope.get(COUNTED):  # (``refused`` marks it counted)
            self.refused(request, str(response.status_code),
                         request.scope.get(ARRIVED, time.perf_counter()))
        return response


class Arrival:
    """Stamps each HTTP request's arrival in its scope (``ARRIVED``), then runs ``app``:
    the duration of an answer ``CountingBoundary`` counts starts there."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[ARRIVED] = time.perf_counter()
        await self.app(scope, receive, send)
