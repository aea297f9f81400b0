"""The Locust users under a real headless Locust run: a request still unanswered when the
run stops is kept in the samples as unfinished, not lost."""

import json
import os
import socket
import subprocess
import sys
import threading

from loadtests.run import LOCUSTFILE
from tests.support.processes import REPO


def test_a_request_unanswered_when_the_run_stops_is_counted_unfinished(tmp_path):
    # a replica that takes every request and never answers
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    samples = tmp_path / "samples.json"
    env = dict(os.environ, KVGATE_MODEL="m", KVGATE_RATE="5", KVGATE_SAMPLES=str(samples),
               KVGATE_WORKLOAD=json.dumps({"params": {"num_docs": 4, "hot_docs": 1},
                                           "requests": 100}))
    try:
        run = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "ContractsUser",
             "--headless", "-u", "3", "-r", "3", "-t", "2s", "--stop-timeout", "1",
             "--host", f"http://127.0.0.1:{server.getsockname()[1]}", "--only-summary",
             "--loglevel", "WARNING"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert samples.exists(), run.stderr[-2000:]
    written = json.loads(samples.read_text())
    # three users, each stuck on its first request
    assert len(written) == 3
    assert all(s["unfinished"] and not s["ok"] for s in written)
