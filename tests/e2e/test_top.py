"""``kvgate top`` in a real terminal (tmux) against a gateway in front of two engine
processes, with traffic from the official OpenAI client."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import openai
import pytest

from kvwire.tokenizer_build import sample_text
from tests.support.binaries import which
from tests.support.fleets import ADMIN_TOKEN, EngineFleet, start_fleet
from tests.support.processes import REPO, Processes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

ROW = re.compile(r"^\W*(r\d)\s*│\s*(\S+)\s*│\s*([\d,]+)\s*│\s*(\d+)\s*│\s*(\d+)%\s*│"
                 r"\s*([\d.]+|-)\s*│\s*([\d.]+|-)\s*│\s*(.*?)\s*│?\s*$")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    """One fleet for the module: each test sends its own traffic and reads what the
    gateway shows; neither changes the fleet."""
    spawn = Processes()
    try:
        yield start_fleet(spawn, tmp_path_factory.mktemp("top"),
                          {"name": "prefix_affinity", "prefix_tokens": 128})
    finally:
        spawn.stop_all()


class Traffic:
    """Questions about four documents, repeated: after the first round every one hits."""

    def __init__(self, gateway: str) -> None:
        self.client = openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused",
                                    max_retries=0)
        rng = random.Random(3)
        self.docs = [sample_text(rng, 300) for _ in range(4)]
        self.turn = 0

    def round(self) -> None:
        self.turn += 1
        for doc in self.docs:
            self.client.completions.create(model="sim-llama", max_tokens=2,
                                           prompt=f"{doc}\nQuestion {self.turn}: why?")


def rows(screen: str) -> dict[str, tuple[str, ...]]:
    return {m.group(1): m.groups()[1:] for m in map(ROW.match, screen.splitlines()) if m}


@pytest.fixture
def tmux() -> Iterator[list[str]]:
    if which("tmux", "Debian's tmux") is None:
        pytest.skip("tmux is not installed (CI installs it in .ci/run)")
    base = ["tmux", "-L", f"kvgate-top-{os.getpid()}", "-f", "/dev/null"]
    yield base
    subprocess.run([*base, "kill-server"], capture_output=True, check=False)


def test_top_shows_each_replica_live(fleet: EngineFleet, tmux: list[str]) -> None:
    traffic = Traffic(fleet.gateway)
    traffic.round()  # documents find their homes; the next rounds hit
    # the pane's own size, not a COLUMNS/LINES the tmux server may have inherited
    command = (f"env -u COLUMNS -u LINES {sys.executable} -m kvgate top "
               f"--admin {fleet.admin} --window 5 --interval 0.5")
    subprocess.run([*tmux, "new-session", "-d", "-s", "top", "-x", "160", "-y", "30",
                    "-c", str(REPO), "-e", f"KVGATE_ADMIN_TOKEN={ADMIN_TOKEN}", command],
                   check=True)
    screen = ""
    last = 0.0

    def shown() -> dict[str, tuple[str, ...]] | None:
        nonlocal screen, last
        if time.monotonic() - last < 0.25:
            return None
        last = time.monotonic()
        screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", "top"],
                                capture_output=True, text=True, check=True).stdout
        found = rows(screen)
        busy = {rid: r for rid, r in found.items()
                if r[4] != "-" and float(r[4]) > 0 and r[5] != "-" and float(r[5]) > 0}
        return found if set(busy) == {"r0", "r1"} else None

    try:
        found = wait_until(shown, 60, "both replicas with hits and requests on the screen",
                           retry=traffic.round, retry_every_s=0.5)
    except AssertionError:
        raise AssertionError(f"screen:\n{screen}") from None
    assert "kvgate top" in screen and "policy prefix_affinity" in screen
    for rid in ("r0", "r1"):
        health, queued, in_flight, kv, hit, rps, reasons = found[rid]
        assert health == "healthy"
        assert int(queued.replace(",", "")) >= 0 and int(in_flight) >= 0 and 0 <= int(kv) <= 100
        assert 0 < float(hit) <= 1 and float(rps) > 0
        assert "affinity" in reasons, screen


def test_top_once_and_a_wrong_token(fleet: EngineFleet) -> None:
    Traffic(fleet.gateway).round()
    env = dict(os.environ, KVGATE_ADMIN_TOKEN=ADMIN_TOKEN, COLUMNS="160")
    once = subprocess.run([sys.executable, "-m", "kvgate", "top", "--admin", fleet.admin,
                           "--once", "--interval", "0.2"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)
    assert once.returncode == 0, once.stderr
    found = rows(once.stdout)
    assert set(found) == {"r0", "r1"}, once.stdout
    assert all(r[0] == "healthy" for r in found.values())
    bad = subprocess.run([sys.executable, "-m", "kvgate", "top", "--admin", fleet.admin,
                          "--once", "--token", "wrong-token-0123456789"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 1
    assert "401" in bad.stderr and "admin token" in bad.stderr
