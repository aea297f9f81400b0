"""``kvgate plan`` on inputs past what it simulates or reads: sizes the simulation cannot
build are refused naming the flag (the arithmetic alone still sizes them), and a capture's
bad lines are skipped and counted, the first named, where they aborted the plan."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.sim_fleet import MAX_FLEET_BLOCKS, FleetSpec
from tests.support.processes import REPO

MEMORY_BYTES = 6 << 30  # a run that tried to build what it was asked is stopped here


def _bounded_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvgate", "plan", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          preexec_fn=_bounded_memory)


@pytest.mark.parametrize(("args", "message"), [
    (("--docs", "10000000000000"),
     "--docs 10000000000000: the simulation draws from at most 1,000,000 documents"),
    (("--doc-tokens", "100000000000000"),
     "--doc-tokens 100000000000000: a document with its question (~100,000,000,000,080 "
     "tokens) is longer than the model's context of 8,192 tokens"),
    (("--replicas", "2000", "--idle-kv-gib", "0.01"),
     "--replicas 2000: the simulation builds at most 1,024 replicas"),
    (("--replicas", "8", "--idle-kv-gib", "4096"),
     "--replicas 8 x --idle-kv-gib 4096 (and room for 4 prompts running): 16,789,376 KV "
     "blocks for the simulation to keep, more than its 16,777,216; at most --replicas 7 "
     "or --idle-kv-gib 4093 here"),
])
def test_a_size_the_simulation_cannot_build_is_refused_naming_its_flag(
        args: tuple[str, ...], message: str) -> None:
    done = plan(*args, "--sim-requests", "20", "--policies", "round_robin")
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert message in done.stderr, done.stderr
    assert "--sim-requests 0 sizes it by the arithmetic alone" in done.stderr
    # without the simulation the same numbers are sized by the arithmetic
    sized = plan(*args, "--sim-requests", "0", "--json")
    assert sized.returncode == 0, sized.stderr
    assert json.loads(sized.stdout)["policies"] == {}


def test_the_simulated_fleet_refuses_more_blocks_than_it_keeps() -> None:
    spec = FleetSpec(replicas=1_000_000, kv_pool_gib=28.0, idle_kv_gib=25.0)
    with pytest.raises(ValueError, match=f"more than the {MAX_FLEET_BLOCKS:,} blocks"):
        spec.check_size()
    FleetSpec().check_size()  # the default fleet: 8 x 28 GiB


def _record(prompt: object) -> bytes:
    return json.dumps({"model": "m", "body": {"model": "m", "prompt": prompt}}).encode()


def test_a_captures_bad_lines_are_skipped_counted_and_the_first_named(
        tmp_path: Path) -> None:
    doc = "The quick brown fox jumps over the lazy dog. " * 30
    chat_without_a_message = json.dumps(
        {"model": "m", "body": {"model": "m", "messages": [None]}}).encode()
    lines = [_record(f"{doc} question {i}") for i in range(6)]
    lines[1:1] = [b""]  # a blank line is no line skipped
    lines[3:3] = [b'{"model": "\xff\xfe", "body": {"prompt": "a"}}',  # line 4: not UTF-8
                  chat_without_a_message,
                  _record("a" * (2 << 20))]  # longer than --max-line-mb 1
    capture = tmp_path / "capture.jsonl"
    capture.write_bytes(b"\n".join(lines) + b"\n")
    done = plan("--workload", str(capture), "--max-line-mb", "1", "--sim-requests", "0",
                "--json")
    assert done.returncode == 0, done.stderr
    p = json.loads(done.stdout)
    w = p["workload"]
    assert w["skipped_lines"] == 3
    assert w["source"] == f"capture {capture} (6 prompts)"
    assert w["first_skipped_line"].startswith("line 4: "), w["first_skipped_line"]
    assert any(note.startswith("3 lines of the capture gave no prompt and were skipped; "
                               "the first, line 4: ") for note in p["notes"]), p["notes"]


def test_a_chat_a_template_refuses_is_skipped_not_fatal(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    capture.write_bytes(b"\n".join([
        json.dumps({"model": "m", "body": {"messages": [None, 5]}}).encode(),
        _record("hello there, a prompt of a few tokens")]) + b"\n")
    done = plan("--workload", str(capture), "--sim-requests", "0", "--json")
    assert done.returncode == 0, done.stderr
    w = json.loads(done.stdout)["workload"]
    assert w["skipped_lines"] == 1
    assert w["first_skipped_line"] == "line 1: messages[0] must be an object, got None"


def test_a_file_with_no_usable_line_is_refused_naming_it(tmp_path: Path) -> None:
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    for flag in ("--workload", "--profile"):
        done = plan(flag, str(binary), "--sim-requests", "0")
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith("kvgate plan: "), done.stderr
        assert str(binary) in done.stderr, done.stderr
    done = plan("--workload", str(binary), "--sim-requests", "0")
    assert "lines skipped; the first, line 1: " in done.stderr, done.stderr
