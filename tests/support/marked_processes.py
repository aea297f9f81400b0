"""Processes a test started, found in /proc: by a mark of their own on their command line,
or as a process's children."""

from __future__ import annotations

import os
from pathlib import Path


def engines_serving_as(mark: str) -> list[int]:
    """The engine processes started with ``--served-by=mark``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"\0--served-by={mark}\0".encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def is_worker(pid: int) -> bool:
    """Whether ``pid`` is a process ``multiprocessing`` spawned (a ``serve --workers``
    worker)."""
    try:
        return b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended meanwhile
        return False
