"""Secrets in the gateway's config (the admin token, the tenancy key) may be written in
the YAML, or kept out of it: read from a file (a mounted Kubernetes Secret) or from an
environment variable."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_secret(value: str | None, file: str | None, env: str | None,
                   name: str) -> str | None:
    """``value`` if set, else the stripped contents of ``file``, else the stripped value
    of the environment variable ``env`` (a Kubernetes Secret made from a file keeps its
    trailing newline, which no header can carry); None when none is configured or what
    it holds is empty.
    ValueError names ``name`` and the source that failed."""
    if value:
        return value
    if file:
        try:
            return Path(file).read_text().strip() or None
        except OSError as exc:
            raise ValueError(f"{name}_file {file!r}: {exc.strerror}") from exc
    if env:
        found = os.environ.get(env)
        if found is None:
            raise ValueError(f"{name}_env {env!r} is not set")
        return found.strip() or None
    return None
