"""The Locust users under a real headless Locust run: a request still unanswered when the
run stops is kept in the samples as unfinished, not lost; one sent after its due time
says how late; an answer cut short or aborted is a failure, whatever content came first."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loadtests.run import LOCUSTFILE
from tests.loadtests.answer_modes import answer_modes
from tests.support.processes import REPO

# a whole streamed answer: a first token, a finish reason, usage and [DONE]
_STREAM = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in (
    {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
    {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}})) \
    + b"data: [DONE]\n\n"
_ANSWERS = {
    "busy": b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nbusy",
    "stream": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: "
              + str(len(_STREAM)).encode() + b"\r\n\r\n" + _STREAM,
}


def _samples(tmp_path: Path, users: int, rate: float, answer_after_s: float | None = None,
             hang_up: bool = False, answer: str = "busy") -> list[dict[str, Any]]:
    """The samples of a 2 s headless run of ContractsUser against a replica that takes
    every request and answers it (``_ANSWERS[answer]``: HTTP 500, or a whole stream) after
    ``answer_after_s`` (None: never), or with ``hang_up`` closes each connection at once."""
    with _replica(answer_after_s, hang_up, _ANSWERS[answer]) as port:
        return _locust_samples(tmp_path, f"http://127.0.0.1:{port}", users, rate)


def _locust_samples(tmp_path: Path, host: str, users: int, rate: float
                    ) -> list[dict[str, Any]]:
    """The samples of a 2 s headless run of ContractsUser against ``host``."""
    samples = tmp_path / "samples.json"
    env = dict(os.environ, KVGATE_MODEL="m", KVGATE_RATE=str(rate),
               KVGATE_SAMPLES=str(samples),
               KVGATE_WORKLOAD=json.dumps({"params": {"num_docs": 4, "hot_docs": 1},
                                           "requests": 100}))
    run = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "ContractsUser",
         "--headless", "-u", str(users), "-r", str(users), "-t", "2s",
         "--stop-timeout", "1", "--host", host, "--only-summary",
         "--loglevel", "WARNING"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert samples.exists(), run.stderr[-2000:]
    return json.loads(samples.read_text())


@contextlib.contextmanager
def _replica(answer_after_s: float | None, hang_up: bool, answer: bytes) -> Iterator[int]:
    """The port of such a replica while the block runs; every connection closed after."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                time.sleep(answer_after_s or 0.0)
                conn.sendall(answer)
        except OSError:  # closed: the test is over
            return

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if hang_up:
                conn.close()
                continue
            held.append(conn)
            if answer_after_s is not None:
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_a_request_unanswered_when_the_run_stops_is_counted_unfinished(tmp_path):
    written = [s for s in _samples(tmp_path, users=3, rate=5) if not s.get("unsent")]
    # three users, each stuck on its first request
    assert len(written) == 3
    assert all(s["unfinished"] and not s["ok"] for s in written)
    # sent in a 2 s run whose clients were stopped 1 s after it: how long each had waited
    # by then (at least that second; the first, sent at the start, 3 s)
    assert all(1.0 <= s["waited_s"] < 10 for s in written)
    assert max(s["waited_s"] for s in written) > 2.5


# why each way of answering (tests.loadtests.answer_modes) fails, None: answered
EXPECTED_ERRORS = {
    "whole": None, "json_whole": None,
    "truncated": "stream ended without [DONE] (cut short)",
    "no_done": "stream ended without [DONE] (cut short)",
    "abort": "finish_reason abort",
    "no_finish": "stream ended without a finish_reason",
    "json_abort": "finish_reason abort",
    "json_no_choices": "answer ended without choices",
    "json_no_finish": "answer ended without a finish_reason",
}


def test_an_answer_cut_short_or_aborted_is_a_failure_with_its_reason(tmp_path, serve):
    server = serve(answer_modes(list(EXPECTED_ERRORS)))
    written = _locust_samples(tmp_path, server.url, users=4, rate=30)
    done = [s for s in written if not s.get("unfinished")]
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for s in done:
        by_mode.setdefault(s["replica"], []).append(s)
    assert set(by_mode) == set(EXPECTED_ERRORS), sorted(by_mode)  # each way, at least once
    for mode, samples in by_mode.items():
        for s in samples:
            # each got its first content token, and still only a whole answer is ok
            assert s["ttft_s"] > 0 and s["e2e_s"] >= s["ttft_s"]
            assert s["ok"] == (EXPECTED_ERRORS[mode] is None), (mode, s)
            assert s.get("error") == EXPECTED_ERRORS[mode], (mode, s)
    # the usage of an answer sent whole is read too
    assert all(s["prompt_tokens"] == 10 for s in by_mode["json_whole"])


def test_a_request_sent_after_its_due_time_says_how_late(tmp_path):
    # one user, requests due every 20 ms, each answered (500) after 0.5 s: the user sends
    # the k-th about 0.5 (k - 1) s after it was due
    written = [s for s in _samples(tmp_path, users=1, rate=50, answer_after_s=0.5)
               if not s.get("unsent")]
    late = [s["late_s"] for s in written]
    assert 2 <= len(late) <= 6
    assert late[0] < 0.2 and late[-1] > 0.4 * (len(late) - 1)
    assert all(s["error"].startswith("HTTP 500") for s in written if not s.get("unfinished"))


def test_a_late_request_is_timed_from_its_due_time_and_unsent_ones_are_written(tmp_path):
    # one user, requests due every 20 ms (Poisson), each answered after 0.5 s: the user
    # sends the k-th about 0.5 (k - 1) s after it was due, and most never
    written = _samples(tmp_path, users=1, rate=50, answer_after_s=0.5, answer="stream")
    sent = [s for s in written if not s.get("unsent")]
    answered = [s for s in sent if s["ok"]]
    assert 2 <= len(answered) <= len(sent) <= 6
    for s in answered:
        # its time to first token counts its wait for a free user, as the simulator's
        # counts from the arrival: at least the answer's 0.5 s on top of its lateness
        assert s["ttft_s"] >= s["late_s"] + 0.45, s
        assert s["e2e_s"] >= s["ttft_s"]
    assert max(s["ttft_s"] for s in answered) > 0.9
    # ~100 fell due in the 2 s run: those no user was free to send are written too, each
    # with how long it had waited when the run stopped (in the order they fell due)
    unsent = [s for s in written if s.get("unsent")]
    assert 50 <= len(unsent) <= 180
    assert all(not s["ok"] and "error" not in s for s in unsent)
    waited = [s["waited_s"] for s in unsent]
    assert waited == sorted(waited, reverse=True) and waited[-1] > 0
    assert [s["index"] for s in written] == list(range(len(written)))


def test_a_request_without_an_answer_says_what_the_connection_did(tmp_path):
    written = _samples(tmp_path, users=1, rate=5, hang_up=True)
    assert written and all(not s["ok"] for s in written)
    done = [s for s in written if not s.get("unfinished")]
    assert done and all(s["error"].startswith("no answer: ") for s in done)
    assert all("Connection" in s["error"] or "closed" in s["error"] for s in done), done


def test_no_request_due_after_the_runs_end_is_sent(tmp_path):
    """A request that falls due once the run's time is up is not the run's: a client that
    drew it before the end does not send it while the run's clients drain."""
    with _replica(0.0, False, _ANSWERS["stream"]) as port:
        samples = _locust_samples(tmp_path, f"http://127.0.0.1:{port}", users=30, rate=10)
    sent = [s for s in samples if not s.get("unsent")]
    assert sent and all(s["ok"] for s in sent)
    # a 2 s run: every request sent fell due within it (spawning takes a moment more)
    assert max(s["due_s"] for s in sent) < 2.25


def test_back_to_back_each_request_is_timed_from_its_send(tmp_path):
    # no rate: one user sends the next request as soon as an answer (0.2 s) comes; each is
    # due when it is taken, so its time is its own answer's, not the run's age
    written = [s for s in _samples(tmp_path, users=1, rate=0, answer_after_s=0.2,
                                   answer="stream") if s["ok"]]
    assert len(written) >= 4
    # each due as it was taken: later ones are due later, none sent late
    due = [s["due_s"] for s in written]
    assert due == sorted(due) and due[-1] > due[0], written
    assert all(s["late_s"] < 0.1 for s in written), written
    # a request taken a second into the run is timed on its answer, not on that second
    assert all(s["ttft_s"] < s["due_s"] for s in written if s["due_s"] > 1.0), written
