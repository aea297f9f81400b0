"""The ``docker run`` lines the Dockerfiles and docs/deploy.md give publish on the host's
loopback only, as compose does: ``-p 8000:8000`` opens the port on every interface of the
host, and an engine answers anyone who reaches it (no key; POST /reset_prefix_cache)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = re.compile(r"docker run\b[^\n]*")


def published(command: str) -> list[str]:
    """The ``-p``/``--publish`` values of one ``docker run`` command line."""
    words = shlex.split(command)
    out = []
    for i, word in enumerate(words):
        if word in ("-p", "--publish"):
            out.append(words[i + 1])
        elif word.startswith("--publish="):
            out.append(word.partition("=")[2])
        elif word.startswith("-p") and len(word) > 2 and not word.startswith("--"):
            out.append(word[2:])
    return out


def test_published() -> None:
    assert published("docker run -p 8000:8000 --publish=1:2 -p127.0.0.1:3:3 img") == \
        ["8000:8000", "1:2", "127.0.0.1:3:3"]


def test_every_documented_docker_run_publishes_on_loopback() -> None:
    sources = [*sorted((ROOT / "deploy").rglob("Dockerfile*")), ROOT / "docs" / "deploy.md"]
    runs = [(path.relative_to(ROOT), line) for path in sources
            for line in RUN.findall(path.read_text())]
    assert len(runs) >= 2  # the gateway's and the GPU engine's
    assert any(published(line) for _, line in runs), runs  # ports to check
    for where, line in runs:
        for port in published(line):
            assert port.startswith("127.0.0.1:"), f"{where}: {line!r} publishes {port}"
