"""Ctrl-C while a third-party router starts (it waits until the router lists every worker
healthy) stops the router and the wait at once, as it does a fleet's engines: the wait
ignored the cancel and ran to its time limit (60 s by default)."""

import subprocess
import sys
import textwrap

from tests.support.netns import isolated
from tests.support.processes import REPO

SCRIPT = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from loadtests import third_party
    from loadtests.local_fleet import FleetCancelled, FleetError, cancel_scope

    tmp = Path(sys.argv[1])
    program = tmp / "router"  # a router that never lists its workers
    program.write_text(f"#!/bin/sh\\necho $$ > {tmp / 'pid'}\\nexec sleep 60\\n")
    program.chmod(0o755)
    router = third_party.ThirdPartyRouter("sglang", "round_robin")
    with cancel_scope() as cancelled:
        cancelled.set()  # Ctrl-C came (cancel_on_signals sets the same event)
        try:
            with third_party.running(router, str(program),
                                     [third_party.Worker("http://127.0.0.1:9")], "m", tmp,
                                     timeout_s=2, grace_s=5):
                print("ready?")
        except FleetCancelled:
            print("cancelled")
        except FleetError as exc:
            print("not cancelled:", str(exc)[:200])
    pid = int((tmp / "pid").read_text()) if (tmp / "pid").exists() else None
    print("router left:", pid is not None and Path(f"/proc/{pid}").exists())
""")


def test_rv27l_a_cancel_stops_the_router_start_and_the_router(tmp_path):
    proc = subprocess.run(isolated([sys.executable, "-c", SCRIPT, str(tmp_path)]), cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["cancelled", "router left: False"], proc.stdout
