"""The capture log (bounded, rotated, written off the event loop), the recent-request ring,
their config, and ``GET /admin/prefix-report`` on a gateway in front of a real loopback
replica."""

from __future__ import annotations

import json
import os
import stat
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.capture import (
    Capture,
    CaptureConfig,
    CaptureRecord,
    PrefixReportConfig,
    RecentPrompts,
    record_of,
    unpack,
)
from gateway.capture_log import CaptureLog
from gateway.config import parse_config
from gateway.request_parse import parse_body
from gateway.state import build_state
from policies.config import ConfigError
from tests.support import prompt_logs
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.nesting import nested
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until, wait_until_async

Serve = Callable[..., ThreadServer]
ADMIN_TOKEN = "admin-token-0123456789"
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def record(i: int, words: int = 40) -> CaptureRecord:
    body = {"model": "m", "prompt": f"request {i} " + "word " * words}
    return CaptureRecord(1764547200.0 + i, "m", "acme", "completions", body, 100)


@pytest.mark.parametrize(("given", "message"), [
    ({"capture": {"path": "x.jsonl", "sample_rate": 0}},
     "config.capture: sample_rate must be in (0, 1], got 0.0"),
    ({"capture": {"path": "x.jsonl", "max_mb": -1}}, "config.capture: max_mb must be > 0"),
    ({"capture": {"path": "x.jsonl", "queue_mb": 0}}, "config.capture: queue_mb must be > 0"),
    ({"capture": {"path": " "}}, "config.capture: path must be a file path or null"),
    ({"capture": {"file": "x"}}, "config.capture: unknown key 'file'"),
    ({"prefix_report": {"recent_requests": 0}},
     "config.prefix_report: recent_requests must be >= 1, got 0"),
])
def test_config_errors_name_the_key_and_value(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as failed:
        parse_config({"replicas": [], **given})
    assert message in str(failed.value)


async def test_the_log_rotates_within_max_bytes_and_keeps_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "capture.jsonl"
    max_bytes = 16_000
    log = CaptureLog(str(path), max_bytes, queue=32)
    await log.start()
    for i in range(200):
        log.offer(record(i))
        if i % 16 == 15:  # let the writer catch up, as traffic would
            await wait_until_async(lambda: log._queue is not None and log._queue.empty(),
                                   10, "the writer to take the queue")
    await log.stop()
    old = path.with_name("capture.jsonl.1")
    sizes = [path.stat().st_size, old.stat().st_size]
    assert max(sizes) <= max_bytes // 2 and sum(sizes) <= max_bytes
    assert log.rotations >= 2 and log.dropped == 0
    lines = old.read_bytes().splitlines() + path.read_bytes().splitlines()
    kept = [CaptureRecord.from_json(line) for line in lines]
    numbers = [int(r.body["prompt"].split()[1]) for r in kept]
    assert numbers == list(range(200 - len(numbers), 200))  # the newest, in order
    assert log.written == 200


async def test_a_full_queue_drops_and_counts_instead_of_waiting(tmp_path: Path) -> None:
    log = CaptureLog(str(tmp_path / "c.jsonl"), 1 << 20, queue=8)
    await log.start()
    for i in range(100):  # no await in between: the writer cannot run
        log.offer(record(i))
    assert log.dropped_full == 92
    await log.stop()
    assert log.written == 8
    assert len((tmp_path / "c.jsonl").read_bytes().splitlines()) == 8


async def test_the_queue_is_bounded_in_bytes_and_holds_lines_not_bodies(
        tmp_path: Path) -> None:
    """A writer that falls behind (a slow disk) holds at most ``queue_mb`` (64) of lines,
    however many of ``queue``'s 1,024 places large bodies would take."""
    capture = Capture(CaptureConfig(path=str(tmp_path / "c.jsonl"), max_mb=4),
                      PrefixReportConfig())
    await capture.start()
    log = capture.log
    assert log is not None
    raw = json.dumps({"model": "m", "prompt": "x" * (1 << 20)}).encode()
    parsed = parse_body(raw, "completions")
    for _ in range(80):  # no await in between: the writer cannot run
        capture.observe(parsed, "acme", len(raw))
    assert log.dropped_full == 17 and log.queued_bytes <= 64 << 20
    await capture.stop()
    assert log.written == 63 and log.dropped == 17


async def test_a_record_too_deep_to_write_is_dropped_and_the_writer_goes_on(
        tmp_path: Path) -> None:
    # orjson reads 1024 levels and writes 254: such a body is served, then not logged
    capture = Capture(CaptureConfig(path=str(tmp_path / "c.jsonl"), sample_rate=0.5),
                      PrefixReportConfig())
    await capture.start()
    assert capture.log is not None
    deep = json.dumps({"model": "m", "prompt": "x", "metadata": nested(300, "x")}).encode()
    chat = json.dumps({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi", "extra": nested(300, "x")}]}
    ]}).encode()
    capture.log.offer(record_of(parse_body(deep, "completions"), "acme", len(deep)))
    capture.observe(parse_body(chat, "chat"), "acme", len(chat))  # sampled: no error
    for i in range(3):
        capture.log.offer(record(i))
    await capture.stop()
    # the completion is dropped; the chat too when it was sampled (at random: its first
    # user message cannot be serialized to pick it by)
    assert capture.log.written == 3 and capture.log.dropped_large in (1, 2)
    assert len((tmp_path / "c.jsonl").read_bytes().splitlines()) == 3


def test_the_ring_is_bounded_in_count_and_bytes() -> None:
    capture = Capture(CaptureConfig(), PrefixReportConfig(enabled=True, recent_requests=5,
                                                          max_mb=1))
    ring = capture.recent
    assert ring is not None and capture.log is None
    for i in range(8):
        ring.add(record(i))
    assert [int(r.body["prompt"].split()[1]) for r in unpack(ring.snapshot())] == \
        [3, 4, 5, 6, 7]
    big = [CaptureRecord(0, "m", None, "completions", {"prompt": "x"}, 400_000)
           for _ in range(4)]
    for r in big:
        ring.add(r)
    assert len(ring) == 2 and ring.bytes == 800_000  # 1 MiB holds two of them
    assert Capture(CaptureConfig(), PrefixReportConfig()).on is False


def test_the_ring_holds_a_bodys_bytes_not_its_python_objects() -> None:
    # 16 MiB of empty lists kept as parsed objects took about 400 MiB (60,000 of them,
    # under the gateway's bound on a body's containers: 3.4 MiB for 180 KB)
    ring = RecentPrompts(8, 64 << 20)
    raw = b'{"model": "m", "prompt": "hi", "pad": [' + b"[]," * 60_000 + b'[]]}'
    tracemalloc.start()
    try:
        ring.add(record_of(parse_body(raw, "completions"), None, len(raw)))
        held = tracemalloc.get_traced_memory()[0]  # the parsed body is gone by now
    finally:
        tracemalloc.stop()
    assert held < 3 * len(raw)
    (kept,) = unpack(ring.snapshot())
    assert kept.body["prompt"] == "hi" and len(kept.body["pad"]) == 60_001


def test_a_record_keeps_no_salt_and_names_the_tenant() -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                      "cache_salt": "client-salt-value"}).encode()
    parsed = parse_body(raw, "chat")
    line = record_of(parsed, "acme", len(raw), now=1764547200.5).to_json()
    assert b"client-salt-value" not in line and b"cache_salt" not in line
    back = CaptureRecord.from_json(line)
    assert (back.tenant, back.model, back.endpoint, back.ts) == ("acme", "m", "chat",
                                                                 1764547200.5)
    assert json.loads(line)["time"] == "2025-12-01T00:00:00.500Z"


async def test_sampling_keeps_or_drops_whole_conversations(tmp_path: Path) -> None:
    capture = Capture(CaptureConfig(path=str(tmp_path / "c.jsonl"), sample_rate=0.5),
                      PrefixReportConfig())
    await capture.start()
    for c in range(40):
        messages: list[dict[str, str]] = []
        for t in range(3):
            messages = [*messages, {"role": "user", "content": f"conversation {c} turn {t}"}]
            raw = json.dumps({"model": "m", "messages": messages}).encode()
            capture.observe(parse_body(raw, "chat"), "acme", len(raw))
            messages = [*messages, {"role": "assistant", "content": "ok"}]
    await capture.stop()
    kept = [CaptureRecord.from_json(line) for line in (tmp_path / "c.jsonl").read_bytes()
            .splitlines()]
    turns: dict[str, int] = {}
    for r in kept:
        first = r.body["messages"][0]["content"]
        turns[first] = turns.get(first, 0) + 1
    assert set(turns.values()) == {3}  # every kept conversation has all its turns
    assert 8 <= len(turns) <= 32  # about half of 40
    assert capture.recent is not None and len(capture.recent) == 120  # the ring has all


def start(serve: Serve, replica: str, **extra: Any) -> tuple[str, str]:
    config = parse_config({
        "replicas": [{"id": "a", "url": replica}], "policy": {"name": "round_robin"},
        "admin": {"token": ADMIN_TOKEN}, "health": {"interval_s": 0.2},
        "scrape": {"interval_s": 0.2}, **extra})
    state = build_state(config)
    pair = serve(create_app(config, state), side=create_admin_app(state))
    return pair.url, pair.side_url


def test_the_prefix_report_of_recent_requests(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a", model=prompt_logs.MODEL)))
    url, admin = start(serve, replica.url, prefix_report={"enabled": True})
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    log = prompt_logs.timestamp_log(n=6)
    for r in log.records:
        client.chat.completions.create(**r["body"])
    assert httpx.get(f"{admin}/admin/prefix-report").status_code == 401
    report = httpx.get(f"{admin}/admin/prefix-report", headers=AUTH, timeout=30).json()
    assert report["requests"] == 6 and report["capture"]["recent_requests"] == 6
    (finding,) = report["findings"]
    assert finding["cause"] == "timestamp" and finding["requests_affected"] == 5
    assert finding["tenant"] is None and finding["tokens_lost"] > 5 * 100


def test_the_prefix_report_is_off_unless_configured(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("a")))
    _, admin = start(serve, replica.url)
    answer = httpx.get(f"{admin}/admin/prefix-report", headers=AUTH)
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "prefix_report_off"
    assert "prefix_report.enabled" in answer.json()["error"]["message"]


async def test_a_log_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    log = CaptureLog(str(blocker / "capture.jsonl"), 1 << 20, queue=4)
    with pytest.raises(OSError, match=r"capture.path '.*a-file/capture.jsonl': cannot open"):
        await log.start()
    await log.stop()  # what a lifespan's exit stack does after a failed start


def test_the_capture_log_counts_on_metrics(serve: Serve, tmp_path: Path) -> None:
    replica = serve(fake_replica(Behaviour("a")))
    url, _ = start(serve, replica.url, capture={"path": str(tmp_path / "c.jsonl")})
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for i in range(3):
        client.completions.create(model="sim-model", prompt=f"request {i}")

    def counts() -> dict[str, float]:
        return {line.split()[0]: float(line.split()[-1])
                for line in httpx.get(f"{url}/metrics").text.splitlines()
                if line.startswith("kvgate_capture_records")}

    wait_until(lambda: counts().get("kvgate_capture_records_written_total") == 3, 10,
               "three records written")
    assert counts()['kvgate_capture_records_dropped_total{cause="queue_full"}'] == 0


async def test_the_log_files_it_makes_are_its_owners_alone(tmp_path: Path) -> None:
    """Every tenant's prompts: neither the log nor its rotated part is readable by others,
    whatever the umask (a common 022 made them world-readable)."""
    path = tmp_path / "c.jsonl"
    log = CaptureLog(str(path), 4_000, queue=64)
    old_umask = os.umask(0o022)
    try:
        await log.start()
        for i in range(40):
            log.offer(record(i))
            await wait_until_async(lambda: log._queue is not None and log._queue.empty(),
                                   10, "the writer to take the queue")
        await log.stop()
    finally:
        os.umask(old_umask)
    assert log.rotations >= 1
    for made in (path, path.with_name("c.jsonl.1")):
        assert stat.S_IMODE(made.stat().st_mode) == 0o600, made
