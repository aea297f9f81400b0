"""A command run in a network namespace of its own, with only loopback up (how the load
test runs a third-party router: nothing it does can leave the machine)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence

import pytest

from tests.support.binaries import which


def isolated(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped to run under ``unshare -rn`` with ``lo`` up; skips the test where
    this sandbox has no ``unshare``/``ip`` or refuses a network namespace (fails instead
    under ``KVGATE_REQUIRE_BINARIES``, as in CI)."""
    unshare = which("unshare", "Debian's util-linux")
    ip = which("ip", "Debian's iproute2")
    if unshare is None or ip is None:
        pytest.skip("unshare or ip is not installed")
    refused = subprocess.run([unshare, "-rn", ip, "link", "set", "lo", "up"],
                             capture_output=True)
    if refused.returncode != 0:
        if os.environ.get("KVGATE_REQUIRE_BINARIES"):  # CI runs it: a skip would hide it
            raise RuntimeError(f"unshare -rn failed: {refused.stderr.decode()[-300:]}")
        pytest.skip("this sandbox refuses a new network namespace")
    command = f"{shlex.quote(ip)} link set lo up && exec {shlex.join(argv)}"
    return [unshare, "-rn", "sh", "-c", command]
