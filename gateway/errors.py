"""The gateway's own errors, on top of the OpenAI error tree in ``kvwire.openai_schema``."""

from __future__ import annotations

from kvwire.openai_schema import OpenAIError, ServiceUnavailable

MODEL_SHOWN_CHARS = 256  # of a model's name in an error: a body may hold megabytes of it


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


class BodyTimeout(OpenAIError):
    """The request body did not arrive within ``limits.body_timeout_s``."""

    status = 408
    type = "invalid_request_error"
    kind = "body_timeout"
