"""The gateway's access-log lines, parsed, as a test's requests end."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

ACCESS = logging.getLogger("kvgate.access")


@contextlib.contextmanager
def access_lines() -> Iterator[list[dict[str, object]]]:
    """The access log's lines, parsed, as they are written while the block runs."""
    lines: list[dict[str, object]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(record.getMessage()))

    collect = Collect()
    ACCESS.addHandler(collect)
    try:
        yield lines
    finally:
        ACCESS.removeHandler(collect)
