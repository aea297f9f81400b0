"""Locust users for the kvgate workloads: streaming chat completions, TTFT as its own metric.

One user class per workload (``ContractsUser``, ``ChatUser``, ``ToolsUser``,
``ChatAppsUser``: apps whose tools go in the ``tools`` field). All users
of a run take the next request of one deterministic stream (``loadtests.workloads``), so
a run issues the same prompts in the same order whatever the number of users.

Configuration comes from the environment (``loadtests.run`` sets it):

``KVGATE_WORKLOAD``   JSON ``{"params": {...}, "requests": N}``: workload spec parameters
                      (the workload name comes from the user class) and stream length.
``KVGATE_MODEL``      model name to put in requests (default: the first of ``/v1/models``).
``KVGATE_RATE``       requests/s of the whole run, as Poisson arrivals (open loop: the
                      next request of the stream is due at the next arrival time and the
                      first free user sends it then, late only when every user is busy);
                      unset: back to back. A workload that times its own requests
                      (``chat-apps``: turns a think time apart) is sent on its own times.
``KVGATE_SAMPLES``    path of a JSON file to write per-request samples to at test stop.
``KVGATE_AFFINITY``   ``1`` to send each request's document or conversation id in the
                      gateway's affinity header.
``KVGATE_TOKENS_PER_WORD`` tokens per word of the replicas' tokenizer: the text's segments
                      get ``length / this`` words (default: the gateway tokenizer's rate).
``KVGATE_HOSTS``      JSON list of base URLs of gateway copies: each request goes to one
                      of them at random (as behind a Kubernetes Service), drawn by its
                      index in the stream (the same for a seed, as the simulator's); unset:
                      ``--host``.

Metrics: request type ``POST`` (whole streamed response) and ``TTFT`` (to the first
content chunk), both named after the workload and timed, like the sample's ``ttft_s`` and
``e2e_s``, from when the request was due (its send, unless every user was busy then: the
simulator's times count from arrivals alike). A failed request's sample says why
(``error``); a stream counts as answered only when it ends with ``data: [DONE]`` and every
choice's finish reason, none ``abort`` (a stream cut short, or an engine's aborted
request, is a failure, whatever content came first); an answer sent whole (JSON, not a
stream) likewise needs its choices and their finish reasons. One still unanswered when the
run stops is marked ``unfinished`` with how long it had waited then (``waited_s``; its
``ttft_s`` if a first token came); each says how late it was sent (``late_s``: the load
is an open loop only while a user is free). Requests that fell due before the run's time
was up but that no user was free to send are written too, ``unsent``, with how long they
had waited when the run stopped.

Headless::

    locust -f loadtests/locustfile.py ContractsUser --headless -u 16 -r 16 -t 60s \
        --host http://127.0.0.1:8000
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import gevent
import numpy as np
import requests
from locust import HttpUser, events, task

from loadtests.error_events import error_told
from loadtests.workloads import (
    TEXT_TOKENS_PER_WORD,
    SegmentContent,
    WorkloadRequest,
    build_spec,
    generate,
)

AFFINITY_HEADER = "x-kvgate-affinity-key"
# finish reasons of an answer that did not end as asked: the engine gave up on it
FAILED_FINISH_REASONS = frozenset({"abort", "error"})

_config: dict[str, Any] = json.loads(os.environ.get("KVGATE_WORKLOAD", "{}") or "{}")
_RATE = float(os.environ.get("KVGATE_RATE", "0") or 0)
_streams: dict[str, Iterator[WorkloadRequest]] = {}
_lock = threading.Lock()
_samples: list[dict[str, Any]] = []
_clock: dict[str, float] = {}  # "due": when the last request taken is due
_gaps = np.random.default_rng([int(_config.get("params", {}).get("seed", 0)), 7])
_HOSTS: list[str] = json.loads(os.environ.get("KVGATE_HOSTS") or "[]")
# the simulator's draws (``loadtests.simulate``: one per request, in the order they arrive)
_pick = np.random.default_rng([int(_config.get("params", {}).get("seed", 0)), 11])
_picks: list[int] = []  # _picks[i]: the gateway copy of request i


def _gateway(index: int) -> int:
    """Which gateway copy request ``index`` goes to (0: the ``--host``): the stream's
    ``index``-th draw, whatever the order the clients come in, so a seed splits the
    requests the same way in every run (and as the simulator does)."""
    if len(_HOSTS) < 2:
        return 0
    with _lock:
        while len(_picks) <= index:
            _picks.append(int(_pick.integers(len(_HOSTS))))
        return _picks[index]


def _stream(workload: str) -> Iterator[WorkloadRequest]:
    """The workload's request stream, generated on first use (the caller holds ``_lock``)."""
    stream = _streams.get(workload)
    if stream is None:
        spec = build_spec(workload, **_config.get("params", {}))
        content = SegmentContent(spec.seed, float(os.environ.get(
            "KVGATE_TOKENS_PER_WORD", TEXT_TOKENS_PER_WORD)))
        stream = _streams[workload] = iter(generate(
            spec, int(_config.get("requests", 100_000)), content))
    return stream


@events.init.add_listener
def _generate_streams(environment: Any, **_: Any) -> None:
    """Generate the streams of the run's user classes before it starts: made at the first
    request instead, a long stream (200,000 chat turns: 6.5 s) ate into the run's time."""
    with _lock:
        for user_class in environment.user_classes:
            workload = getattr(user_class, "workload", "")
            if workload:
                _stream(workload)
    # the event loop's clock stood still meanwhile: the run's time limit, set next, would
    # count from before the wait
    gevent.get_hub().loop.update_now()


def next_request(workload: str) -> tuple[WorkloadRequest, float]:
    """The stream's next request and when it is due (``time.monotonic()`` seconds)."""
    with _lock:
        stream = _stream(workload)
        now = time.monotonic()
        req = next(stream)
        start = _clock.setdefault("start", now)
        if req.arrival_s is not None:  # a workload that times its own turns (chat-apps)
            return req, start + req.arrival_s
        if _RATE <= 0:  # back to back: each request is due when a client takes it
            return req, now
        due = _clock.setdefault("due", now)
        due = _clock["due"] = due + float(_gaps.exponential(1.0 / _RATE))
        return req, due


class _WorkloadUser(HttpUser):
    abstract = True
    workload = ""
    def wait_time(self) -> float:
        return 0.0  # pacing is by each request's due time (see ``next_request``)
    _model: str | None = None

    def on_start(self) -> None:
        model = os.environ.get("KVGATE_MODEL")
        if not model and _WorkloadUser._model is None:
            resp = self.client.get("/v1/models", name="models")
            resp.raise_for_status()
            model = resp.json()["data"][0]["id"]
        _WorkloadUser._model = model or _WorkloadUser._model

    @task
    def ask(self) -> None:
        req, due = next_request(self.workload)
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # gevent's sleep under Locust: other users run meanwhile
        with _lock:
            end, start = _clock.get("end"), _clock["start"]
        if end is not None and due >= end:
            return  # due once the run's time was up (while its clients drain): not the run's
        body = {
            "model": _WorkloadUser._model,
            "messages": req.messages(),
            "max_tokens": req.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tools = req.tools()
        if tools:
            body["tools"] = tools
        headers = {}
        if os.environ.get("KVGATE_AFFINITY") == "1":
            headers[AFFINITY_HEADER] = req.affinity_key
        gateway = _gateway(req.index)
        url = f"{_HOSTS[gateway]}/v1/chat/completions" if _HOSTS else "/v1/chat/completions"
        # sent after its due time: every client was busy until then
        late = max(0.0, time.monotonic() - due)
        # kept from the start: a request still unanswered when the run stops is counted
        # (``unfinished``), not lost
        sample: dict[str, Any] = {"index": req.index, "label": req.label, "ok": False,
                                  "gateway": gateway, "unfinished": True, "late_s": late,
                                  "due_s": due - start}  # from the run's start
        # its times count from when it was due, as the simulator's from its arrival: a
        # router that keeps every client busy is not timed only once one is free
        started = time.perf_counter() - late
        _record(sample, started)
        with self.client.post(url, json=body, headers=headers,
                              stream=True, catch_response=True, name=self.workload) as resp:
            # the gateway's word, else the engine's own (``kvgate engine --served-by``), which
            # other routers pass on
            sample["replica"] = (resp.headers.get("x-kvgate-replica")
                                 or resp.headers.get("x-kvgate-served-by"))
            sample["route"] = resp.headers.get("x-kvgate-route")
            if resp.status_code != 200:
                # status 0: no answer at all (Locust keeps the connection error)
                why = f"HTTP {resp.status_code}: {resp.text[:200]}" if resp.status_code else \
                    f"no answer: {getattr(resp, 'error', None)!r}"[:300]
                _fail(resp, sample, why)
                del sample["unfinished"]
                return
            whole = "text/event-stream" not in resp.headers.get("content-type", "")
            try:
                if whole:  # an answer sent whole (a router that does not stream)
                    problem = self._read_whole(resp, started, sample)
                else:
                    problem = self._read_stream(resp, started, sample)
            except (ValueError, KeyError, TypeError, AttributeError,
                    requests.RequestException) as exc:
                _fail(resp, sample, f"bad {'answer' if whole else 'stream'}: {exc}"[:300])
            else:
                if problem is None and sample.get("ttft_s") is None:
                    problem = "stream ended without content"
                if problem is not None:
                    _fail(resp, sample, problem)
                else:
                    sample["ok"] = True
                    resp.success()
        sample["e2e_s"] = time.perf_counter() - started
        del sample["unfinished"]

    def _first_token(self, started: float, sample: dict[str, Any]) -> None:
        if sample.get("ttft_s") is None:
            ttft = time.perf_counter() - started
            sample["ttft_s"] = ttft
            events.request.fire(request_type="TTFT", name=self.workload,
                                response_time=ttft * 1000.0, response_length=0,
                                exception=None, context={})

    def _read_stream(self, resp: Any, started: float, sample: dict[str, Any]) -> str | None:
        """Read a streamed answer; what was wrong with its end, None if nothing."""
        finish: dict[int, str | None] = {}  # each choice seen: its finish reason
        done = False
        # chunk_size=None: each line as soon as it arrives (the default buffers 512 bytes,
        # which holds the first token back until a few more have come)
        for line in resp.iter_lines(chunk_size=None):
            if not line or not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            error = error_told(chunk)
            if error is not None:
                raise ValueError(error)
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                reason = choice.get("finish_reason")
                index = int(choice.get("index") or 0)
                finish[index] = reason or finish.get(index)
                if delta.get("content") or reason:
                    self._first_token(started, sample)
            _usage(chunk, sample)
        return _finish_problem(finish, "stream", done)

    def _read_whole(self, resp: Any, started: float, sample: dict[str, Any]) -> str | None:
        """Read an answer sent whole; what was wrong with it, None if nothing."""
        body = resp.json()
        self._first_token(started, sample)  # its content came all at once
        if not isinstance(body, dict):
            raise ValueError(f"not an object: {str(body)[:100]}")
        error = error_told(body)
        if error is not None:
            raise ValueError(error)
        _usage(body, sample)
        return _finish_problem({int(c.get("index") or 0): c.get("finish_reason")
                                for c in body.get("choices") or ()}, "answer")


def _finish_problem(finish: dict[int, str | None], what: str, done: bool = True
                    ) -> str | None:
    """What is wrong with an answer's end, None if nothing: given each choice's finish
    reason, and for a stream whether its ``[DONE]`` came."""
    failed = sorted({r for r in finish.values() if r in FAILED_FINISH_REASONS})
    if failed:
        return f"finish_reason {failed[0]}"
    if not done:
        return "stream ended without [DONE] (cut short)"
    if not finish:
        return f"{what} ended without choices"
    if any(reason is None for reason in finish.values()):
        return f"{what} ended without a finish_reason"
    return None


def _usage(obj: dict[str, Any], sample: dict[str, Any]) -> None:
    usage = obj.get("usage")
    if usage:
        sample["prompt_tokens"] = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        sample["cached_tokens"] = details.get("cached_tokens")


def _fail(resp: Any, sample: dict[str, Any], why: str) -> None:
    """Mark the request failed in Locust's stats and say why in its sample."""
    sample["error"] = why
    resp.failure(why)


_sent: dict[int, float] = {}  # id of a sample -> when its request was sent (perf_counter)


def _record(sample: dict[str, Any], sent: float) -> None:
    with _lock:
        _samples.append(sample)
        _sent[id(sample)] = sent


@events.test_stopping.add_listener
def _run_ends(**_kwargs: Any) -> None:
    """The run's time is up: requests due from now on are not the run's."""
    with _lock:
        _clock.setdefault("end", time.monotonic())


def _unsent(now: float) -> list[dict[str, Any]]:
    """The requests that fell due before the run's end but that no client was free to
    send (the caller holds ``_lock``): each with how long it had waited at ``now``
    (``time.monotonic()``), a lower bound on its time to first token. Without them, a
    router that keeps every client waiting would be timed on fewer requests than one
    that answers at the offered rate."""
    end, start = _clock.get("end", now), _clock.get("start")
    if start is None:
        return []
    out: list[dict[str, Any]] = []
    for stream in _streams.values():
        due = _clock.get("due", start)
        for req in stream:
            if req.arrival_s is not None:
                due = start + req.arrival_s
            elif _RATE > 0:
                due += float(_gaps.exponential(1.0 / _RATE))
            else:  # back to back: nothing is due that a client did not take
                break
            if due >= end:
                break
            out.append({"index": req.index, "label": req.label, "ok": False,
                        "unsent": True, "late_s": now - due, "waited_s": now - due})
    return out


@events.test_stop.add_listener
def _write_samples(**_kwargs: Any) -> None:
    path = os.environ.get("KVGATE_SAMPLES")
    if path:
        now = time.perf_counter()
        with _lock, open(path, "w") as f:
            # a request unanswered when the run stopped, or one that failed (its answer
            # never came): how long it had waited by then (a lower bound on its time to
            # first token, if none came; for a failed one, its time to a whole answer)
            json.dump([s if s.get("ok") else dict(s, waited_s=now - _sent[id(s)])
                       for s in _samples] + _unsent(time.monotonic()), f)


class ContractsUser(_WorkloadUser):
    workload = "contracts"


class ChatUser(_WorkloadUser):
    workload = "chat"


class ToolsUser(_WorkloadUser):
    workload = "tools"


class ChatAppsUser(_WorkloadUser):
    workload = "chat-apps"
