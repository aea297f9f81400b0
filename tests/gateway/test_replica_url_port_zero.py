"""A replica address with port 0 is refused when the config is loaded, naming it: nothing
can connect to port 0, so the replica would only ever fail its health checks (its URL)
or never send a KV event (a ZMQ connect to port 0 is taken and waits for ever)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import load_config
from policies.config import ConfigError


def write_config(tmp_path: Path, replica: dict[str, str]) -> Path:
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump({"policy": {"name": "round_robin"},
                                    "replicas": [{"id": "r0", **replica}]}))
    return path


@pytest.mark.parametrize("url", ["http://127.0.0.1:0", "https://[::1]:00/vllm"])
def test_a_replica_url_with_port_0_is_refused_naming_the_url(tmp_path: Path, url: str
                                                             ) -> None:
    with pytest.raises(ConfigError, match="port 0") as err:
        load_config(write_config(tmp_path, {"url": url}))
    assert f"url {url!r} has port 0" in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "kvgate.yaml"))


@pytest.mark.parametrize("key", ["kv_events", "kv_events_replay"])
def test_a_kv_events_endpoint_with_port_0_is_refused_naming_it(tmp_path: Path, key: str
                                                               ) -> None:
    endpoint = "tcp://127.0.0.1:0"
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, {"url": "http://127.0.0.1:8101", key: endpoint}))
    assert f"{key} {endpoint!r} has port 0" in str(err.value)


def test_other_ports_and_endpoints_still_load(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, {
        "url": "http://127.0.0.1:8101", "kv_events": "tcp://[::1]:10",
        "kv_events_replay": "ipc:///tmp/kv0"}))
    replica = config.replicas[0]
    assert (replica.url, replica.kv_events, replica.kv_events_replay) == (
        "http://127.0.0.1:8101", "tcp://[::1]:10", "ipc:///tmp/kv0")
    assert load_config(write_config(tmp_path, {"url": "http://127.0.0.1"})).replicas[0].url \
        == "http://127.0.0.1"  # no port: the scheme's
