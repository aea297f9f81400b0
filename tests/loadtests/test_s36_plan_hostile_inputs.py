"""``kvgate plan`` on inputs past what it simulates: sizes the simulation cannot build are
refused naming the flag (the arithmetic alone still sizes them)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

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
