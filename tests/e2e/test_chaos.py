"""Replicas die (SIGKILL) and freeze (SIGSTOP) under streamed and non-streamed load: no
non-streamed request is lost, every cut stream says so, the frozen replica is ejected and
readmitted when it thaws."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fleets import start_fleet
from tests.support.processes import Processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
STREAM_FIRST_BYTE_S = 3.0


class Load:
    """Worker threads sending streamed and non-streamed completions until stopped."""

    def __init__(self, gateway: str, workers: int = 6) -> None:
        self.gateway = gateway
        self.plain: list[tuple[int, str]] = []  # status, text
        self.streams: list[tuple[int, str]] = []  # status, last data line
        self.long_started = 0  # long streams that got their first event
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, args=(i,)) for i in range(workers)]

    def long_streams(self, n: int) -> None:
        """``n`` more streams of 400 tokens (round robin puts one on each replica)."""
        def one(i: int) -> None:
            with httpx.Client(base_url=self.gateway, timeout=60) as http:
                self._stream(http, {"model": "sim-llama", "prompt": f"long {i}",
                                    "max_tokens": 400}, long=True)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        self._threads += threads
        for t in threads:
            t.start()

    def _stream(self, http: httpx.Client, body: dict[str, object], long: bool = False
                ) -> None:
        lines: list[str] = []
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    if long and not lines:
                        self.long_started += 1
                    lines.append(line)
        self.streams.append((r.status_code, lines[-1] if lines else ""))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    @property
    def done(self) -> int:
        return len(self.plain) + len(self.streams)

    def _work(self, worker: int) -> None:
        with httpx.Client(base_url=self.gateway, timeout=60) as http:
            i = 0
            while not self._stop.is_set():
                i += 1
                body = {"model": "sim-llama", "prompt": f"chaos {worker} {i}", "max_tokens": 24}
                if i % 2:
                    r = http.post("/v1/completions", json=body)
                    text = r.json()["choices"][0]["text"] if r.status_code == 200 else r.text
                    self.plain.append((r.status_code, text))
                    continue
                self._stream(http, body)


def test_killed_and_frozen_replicas_under_load(spawn: Processes, tmp_path: Path) -> None:
    fleet = start_fleet(
        spawn, tmp_path, {"name": "round_robin"}, replicas=4,
        health={"interval_s": 0.3, "timeout_s": 0.5, "failures_to_eject": 2,
                "request_failures_to_eject": 2, "ejection_s": 1},
        timeouts={"first_byte_s": 30, "stream_first_byte_s": STREAM_FIRST_BYTE_S,
                  "idle_s": 2})

    def replicas() -> dict[str, dict[str, object]]:
        listed = httpx.get(f"{fleet.admin}/admin/replicas",
                           headers=fleet.admin_headers).json()["replicas"]
        return {r["id"]: r for r in listed}

    def health() -> dict[str, bool]:
        return {rid: bool(r["healthy"]) for rid, r in replicas().items()}

    killed, frozen = fleet.replicas[0].proc, fleet.replicas[1].proc
    with Load(fleet.gateway) as load:
        wait_until(lambda: load.done >= 12, 30, "load to start")
        load.long_streams(4)  # some of them are half way on r0, and on r1, when it happens
        wait_until(lambda: load.long_started == 4, 30, "the long streams to start")
        killed.send_signal(signal.SIGKILL)
        mark = load.done
        wait_until(lambda: load.done >= mark + 12, 30, "load to go on without r0")
        frozen.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_until(lambda: not health()["r1"], 2 * STREAM_FIRST_BYTE_S,
                       "the frozen replica to be ejected")
            mark = load.done
            wait_until(lambda: load.done >= mark + 12, 30, "load to go on without r1")
        finally:
            frozen.send_signal(signal.SIGCONT)
        ejected_after = time.monotonic() - stopped
        wait_until(lambda: health()["r1"], 15, "the thawed replica to be readmitted")
        mark = load.done
        wait_until(lambda: load.done >= mark + 8, 30, "load to go on with r1 back")
    cut = sum(1 for _, last in load.streams if last != "data: [DONE]")
    assert cut >= 1  # the kill and the freeze caught streams half way
    assert health() == {"r0": False, "r1": True, "r2": True, "r3": True}
    assert ejected_after < 2 * STREAM_FIRST_BYTE_S
    # no non-streamed request lost: each got its whole answer
    assert load.plain and all(status == 200 and text for status, text in load.plain), \
        [p for p in load.plain if p[0] != 200][:3]
    # every stream ends with [DONE], or with an error event saying it was cut
    for status, last in load.streams:
        assert status == 200, (status, last)
        assert last == "data: [DONE]" or "error" in json.loads(last[6:]), last
