"""Programs some tests drive (kubectl, prometheus, tmux, openssl): found on PATH, or those tests
skip; where ``KVGATE_REQUIRE_BINARIES`` is set (``.ci/run`` sets it, after installing
them) a missing one fails instead, so CI never passes by skipping."""

from __future__ import annotations

import os
import shutil


def which(name: str, install: str) -> str | None:
    """The path of ``name``, or None; ``install`` says how to get it."""
    path = shutil.which(name)
    if path is None and os.environ.get("KVGATE_REQUIRE_BINARIES"):
        raise RuntimeError(f"{name} is not installed ({install}) and KVGATE_REQUIRE_BINARIES "
                           "is set")
    return path
