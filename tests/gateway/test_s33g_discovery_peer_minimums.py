"""Discovery's and the peers' times too short to mean anything (a typo's 1e-9) are refused
at load, naming the key and the value, as the rest of the config's are: a DNS, Kubernetes
or peer lookup loop that spins a core, a timeout no answer meets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigError, load_config, parse_config
from gateway.discovery.config import DNSSourceConfig, KubernetesSourceConfig

REPLICAS = {"replicas": [{"id": "a", "url": "http://127.0.0.1:9"}]}
DNS = {"type": "dns", "name": "vllm.example", "port": 8000}
KUBE = {"type": "kubernetes", "namespace": "llm", "service": "vllm"}


@pytest.mark.parametrize(("section", "where", "key", "value", "least"), [
    ("discovery", DNS, "interval_s", 1e-9, "0.01"),
    ("discovery", DNS, "interval_s", 0.001, "0.01"),
    ("discovery", DNS, "timeout_s", 1e-9, "0.001"),
    ("discovery", KUBE, "resync_s", 1e-9, "0.01"),
    ("discovery", KUBE, "retry_s", 1e-9, "0.01"),
    ("peers", {}, "resolve_s", 1e-9, "0.01"),
    ("peers", {}, "pending_s", 1e-9, "0.001"),
    # none or less: the same one line
    ("discovery", KUBE, "resync_s", 0.0, "0.01"),
    ("discovery", KUBE, "retry_s", -0.5, "0.01"),
    ("peers", {}, "resolve_s", -1.0, "0.01"),
    ("peers", {}, "pending_s", 0.0, "0.001"),
])
def test_a_time_below_its_least_is_refused_naming_key_and_value(
        section: str, where: dict[str, Any], key: str, value: float, least: str) -> None:
    body: Any = [{**where, key: value}] if section == "discovery" else {key: value}
    at = r"discovery\[0\]" if section == "discovery" else section
    with pytest.raises(ConfigError, match=rf"^config\.{at}: {key} must be at least "
                                          rf"{least} s, got {value!r}$"):
        parse_config({**REPLICAS, section: body})


def test_the_least_times_are_taken() -> None:
    config = parse_config({**REPLICAS, "discovery": [
        {**DNS, "interval_s": 0.01, "timeout_s": 0.001},
        {**KUBE, "resync_s": 0.01, "retry_s": 0.01}],
        "peers": {"resolve_s": 0.01, "pending_s": 0.001}})
    dns, kube = config.discovery
    assert isinstance(dns, DNSSourceConfig) and isinstance(kube, KubernetesSourceConfig)
    assert (dns.interval_s, dns.timeout_s) == (0.01, 0.001)
    assert (kube.resync_s, kube.retry_s) == (0.01, 0.01)
    assert (config.peers.resolve_s, config.peers.pending_s) == (0.01, 0.001)


def test_a_config_file_with_a_spinning_discovery_is_refused_in_one_line(
        tmp_path: Path) -> None:
    bad = tmp_path / "gw.yaml"
    bad.write_text(yaml.safe_dump({**REPLICAS, "discovery": [{**DNS, "interval_s": 1e-9}]}))
    with pytest.raises(ConfigError) as refused:
        load_config(bad)
    assert str(refused.value) == f"{bad}.discovery[0]: interval_s must be at least 0.01 s, " \
        "got 1e-09"
