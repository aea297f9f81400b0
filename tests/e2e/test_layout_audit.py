"""The prompt-layout audit as it is used: a gateway process with capture on (client keys
and tenant isolation on too) in front of a real engine, requests through the official
OpenAI client, then ``kvgate audit`` as a process on the log and the admin API's report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from gateway.tenancy import tenant_salt
from tests.support import prompt_logs
from tests.support.fleets import start_fleet
from tests.support.processes import REPO, Processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

API_KEY = "acme-client-key-0123456789abcdef"
SECRET = "tenant-secret-0123456789abcdef-0123456789"
CLIENT_SALT = "client-chosen-salt-42"


def audit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvgate", "audit", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_capture_then_audit_and_live_report(spawn: Processes, tmp_path: Path) -> None:
    log_path = tmp_path / "capture" / "requests.jsonl"
    fleet = start_fleet(
        spawn, tmp_path, {"name": "prefix_affinity"}, replicas=1,
        capture={"path": str(log_path), "max_mb": 4},
        auth={"api_keys": [{"key": API_KEY, "tenant": "acme"}]},
        tenancy={"isolate": True, "secret": SECRET}, trusted_proxies=["127.0.0.1/32"])
    client = openai.OpenAI(base_url=f"{fleet.gateway}/v1", api_key=API_KEY, max_retries=0)
    log = prompt_logs.timestamp_log(n=8)
    for i, r in enumerate(log.records):
        extra = {"extra_body": {"cache_salt": CLIENT_SALT}} if i == 3 else {}
        done = client.chat.completions.create(**r["body"], **extra)
        assert done.usage is not None and done.usage.prompt_tokens > 100

    def lines() -> list[bytes]:
        return log_path.read_bytes().splitlines() if log_path.exists() else []

    wait_until(lambda: len(lines()) == 8, 10, "the capture writer to write 8 records")
    raw = log_path.read_bytes()
    for secret in (API_KEY, SECRET, CLIENT_SALT, tenant_salt(SECRET.encode(), "acme", None),
                   tenant_salt(SECRET.encode(), "acme", CLIENT_SALT)):
        assert secret.encode() not in raw
    first = json.loads(lines()[0])
    assert (first["tenant"], first["model"], first["endpoint"]) == ("acme", "sim-llama",
                                                                     "chat")
    assert first["body"]["messages"] == log.records[0]["body"]["messages"]

    as_json = audit_cli("--json", str(log_path))
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["requests"] == 8
    (finding,) = report["findings"]
    assert {"cause", "position", "context", "requests_affected", "tokens_lost"} <= set(finding)
    assert (finding["cause"], finding["requests_affected"], finding["tenant"]) == (
        "timestamp", 7, "acme")
    assert "Current time: «2026-12-01 10:" in finding["context"]

    text = audit_cli(str(log_path))
    assert text.returncode == 0, text.stderr
    assert f"1. timestamp at token {finding['position']}" in text.stdout
    assert f"7 requests, {finding['tokens_lost']} tokens lost" in text.stdout

    live = httpx.get(f"{fleet.admin}/admin/prefix-report", headers=fleet.admin_headers,
                     timeout=60)
    assert live.status_code == 200, live.text
    body = live.json()
    assert body["requests"] == 8 and body["capture"]["written"] == 8
    assert body["findings"] == report["findings"]  # the same audit of the same requests

    missing = audit_cli(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "kvgate audit:" in missing.stderr


def test_a_log_with_no_capture_record_is_an_error_not_a_clean_report(tmp_path: Path) -> None:
    garbage, empty = tmp_path / "garbage.jsonl", tmp_path / "empty.jsonl"
    garbage.write_bytes(b"\x00\xff not json\n{\"half\": \n")
    empty.write_text("")
    for path, said in ((garbage, "2 lines not readable"), (empty, "empty")):
        done = audit_cli(str(path))
        assert done.returncode == 2, done.stdout
        assert "no capture record" in done.stderr and said in done.stderr
        assert "no lost prefix sharing found" not in done.stdout
