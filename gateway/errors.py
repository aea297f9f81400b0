"""The gateway's exception tree, mapped to OpenAI-style error bodies at one boundary."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse


class GatewayError(Exception):
    """An error the client sees as ``{"error": {"message", "type", "param", "code"}}``."""

    status = 500
    type = "server_error"
    kind = "internal"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    kind = "bad_request"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    kind = "unauthorized"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    kind = "not_found"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    kind = "too_large"


class NoReplicaAvailable(GatewayError):
    status = 503
    type = "service_unavailable"
    kind = "no_replica"

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message, code="no_healthy_replica",
                         headers={"Retry-After": str(retry_after_s)})


class UpstreamError(GatewayError):
    """Every replica tried failed before sending a first byte."""

    status = 502
    type = "upstream_error"
    kind = "upstream"


class UpstreamTimeout(UpstreamError):
    status = 504
    kind = "upstream_timeout"


def error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def handle_gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.errors.labels(kind=exc.kind).inc()
    return error_response(exc)
