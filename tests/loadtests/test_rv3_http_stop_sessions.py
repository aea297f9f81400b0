"""Stopping what the load harness started reaches every process it started: a process
that ignores SIGTERM was SIGKILLed alone, and whatever it had started in a process group of
its own (as ``kvgate serve --workers`` does) was left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadtests.local_fleet import end_session, session_members
from tests.support.netns import isolated
from tests.support.processes import REPO

# a process that starts a child in a process group of its own, which ignores SIGTERM and
# starts a grandchild; prints the three process ids, then serves (a router's ``/workers``,
# on ``--port``) or sleeps. With IGNORE_TERM set, it ignores SIGTERM too.
_TREE = """\
import http.server, json, os, signal, sys, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = os.fork()
    if grandchild == 0:
        time.sleep(30)
        os._exit(0)
    os.write(w, str(grandchild).encode())
    time.sleep(30)
    os._exit(0)
os.close(w)
pids = f"{os.getpid()} {child} {os.read(r, 20).decode()}"
if os.environ.get("PIDS_FILE"):
    with open(os.environ["PIDS_FILE"], "w") as f:
        f.write(pids)
else:
    print(pids, flush=True)
if "--port" not in sys.argv:
    time.sleep(30)
    sys.exit(0)

class Workers(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"workers": [{"is_healthy": True}]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

port = int(sys.argv[sys.argv.index("--port") + 1])
http.server.HTTPServer(("127.0.0.1", port), Workers).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"  # ended, not yet reaped: not alive


def test_a_process_ended_by_sigterm_has_what_it_left_running_killed() -> None:
    popen = subprocess.Popen([sys.executable, "-c", _TREE], stdout=subprocess.PIPE,
                             start_new_session=True)
    assert popen.stdout is not None
    pids = [int(p) for p in popen.stdout.readline().split()]
    popen.stdout.close()
    assert len(pids) == 3 and all(map(_alive, pids))
    assert sorted(session_members(popen.pid)) == sorted(pids)
    popen.send_signal(signal.SIGTERM)  # it ends; its child and grandchild ignore it
    end_session(popen, time.monotonic() + 0.2)
    assert popen.returncode == -signal.SIGTERM
    assert [pid for pid in pids if _alive(pid)] == []
    assert session_members(popen.pid) == []


_RUN_ROUTER = """\
import sys
from pathlib import Path
from loadtests import third_party
router = third_party.ThirdPartyRouter("sglang", "round_robin")
with third_party.running(router, sys.argv[1], [third_party.Worker("http://127.0.0.1:9")],
                         "m", Path(sys.argv[2]), timeout_s=20, grace_s=0.2) as url:
    print(url)
"""


def test_a_router_that_ignores_sigterm_is_killed_with_all_it_started(tmp_path: Path) -> None:
    program = tmp_path / "sglang-router"
    program.write_text(f"#!{sys.executable}\n{_TREE}")
    program.chmod(0o755)
    pids_file = tmp_path / "pids"
    run = subprocess.run(isolated([sys.executable, "-c", _RUN_ROUTER, str(program),
                                   str(tmp_path)]),
                         cwd=REPO, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, IGNORE_TERM="1", PIDS_FILE=str(pids_file)))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("http://127.0.0.1:")
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 3
    assert [pid for pid in pids if _alive(pid)] == []
