import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.support.metrics import samples
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def kvgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvgate", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def kv_event_messages(gateway: str) -> float:
    with urllib.request.urlopen(f"{gateway}/metrics", timeout=5) as resp:
        got = samples(resp.read().decode())
    return sum(value for (name, _), value in got.items()
               if name == "kvgate_kv_event_messages_total")


@pytest.mark.parametrize("flags, published", [((), True), (("--no-kv-events",), False)])
def test_fleet_up_has_its_engines_publish_kv_events_unless_told_not_to(
        tmp_path: Path, flags: tuple[str, ...], published: bool) -> None:
    state = tmp_path / "fleet"
    up = kvgate("fleet", "up", "--detach", "--port", "0", "--replicas", "1", "--policy",
                "cost", "--kv-cache-gib", "0.5", "--state-dir", str(state), *flags)
    try:
        assert up.returncode == 0, up.stderr
        gateway = json.loads((state / "fleet.json").read_text())["gateway_url"]
        replica = yaml.safe_load((state / "gateway.yaml").read_text())["replicas"][0]
        assert ("kv_events" in replica) is published
        with urllib.request.urlopen(f"{gateway}/v1/models", timeout=10) as resp:
            model = json.loads(resp.read())["data"][0]["id"]

        def send() -> None:
            body = json.dumps({"model": model, "prompt": "the parties agree " * 60,
                               "max_tokens": 2}).encode()
            request = urllib.request.Request(f"{gateway}/v1/completions", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as resp:
                assert resp.status == 200

        send()
        if published:
            wait_until(lambda: kv_event_messages(gateway) > 0, 15,
                       "the engine's KV events to reach the gateway", retry=send)
        else:
            assert kv_event_messages(gateway) == 0
    finally:
        down = kvgate("fleet", "down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr


def test_fleet_up_on_a_port_in_use_fails_rather_than_handing_out_another_servers_url(
        tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:  # something else holds the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = kvgate("fleet", "up", "--detach", "--port", str(port), "--replicas", "1",
                    "--state-dir", str(tmp_path / "fleet"))
        assert up.returncode != 0
        assert f"port {port} on 127.0.0.1 is in use" in up.stderr
        assert not (tmp_path / "fleet" / "fleet.json").exists()


def test_fleet_up_and_down_refuse_bad_input_in_one_line(tmp_path: Path) -> None:
    for replicas in ("0", "100000"):
        up = kvgate("fleet", "up", "--detach", "--replicas", replicas, "--state-dir",
                    str(tmp_path / "fleet"))
        assert up.returncode == 2 and "replicas must be in [1, 256]" in up.stderr
        assert "Traceback" not in up.stderr
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "fleet.json").write_text("{broken")
    down = kvgate("fleet", "down", "--state-dir", str(broken))
    assert down.returncode == 1 and "is not a fleet's state file" in down.stderr
    assert "Traceback" not in down.stderr


def test_an_engine_whose_port_was_taken_before_it_bound_is_started_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from loadtests import local_fleet

    with socket.socket() as taken:  # another process's socket lands on the picked port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        picks = iter([port])
        real = local_fleet.free_port
        monkeypatch.setattr(local_fleet, "free_port",
                            lambda host="127.0.0.1": next(picks, None) or real(host))
        fleet = local_fleet.LocalFleet(local_fleet.LocalFleetSpec(replicas=1, gateways=0),
                                       tmp_path / "fleet")
        try:
            fleet.start()
            (url,) = fleet.engine_urls
            assert not url.endswith(f":{port}")
            assert fleet.replicas[0]["url"] == url
        finally:
            fleet.stop()
