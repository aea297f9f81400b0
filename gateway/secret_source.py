"""Secrets in the gateway's config (the admin token, the tenancy key, a replica's
``api_key``) may be written in the YAML, or kept out of it: read from a file (a mounted
Kubernetes Secret) or from an environment variable. The resolver is
:mod:`kvwire.secret_source`, shared with the engine's ``--api-key``."""

from __future__ import annotations

from kvwire.secret_source import (
    MAX_SECRET_FILE_BYTES,
    check_bearer,
    resolve_bearer,
    resolve_secret,
)

__all__ = ["MAX_SECRET_FILE_BYTES", "check_bearer", "resolve_bearer", "resolve_secret"]
