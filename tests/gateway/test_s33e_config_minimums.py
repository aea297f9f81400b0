"""Times too short to mean anything (a typo's 1e-9) are refused at load, naming the key and
the value: a health or scrape loop that spins a core, a timeout no answer meets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config, parse_config

REPLICAS = {"replicas": [{"id": "a", "url": "http://127.0.0.1:9"}]}


@pytest.mark.parametrize(("section", "key", "value", "least"), [
    ("health", "interval_s", 1e-9, "0.01"),
    ("health", "models_refresh_s", 0.001, "0.01"),
    ("health", "timeout_s", 1e-9, "0.001"),
    ("scrape", "interval_s", 1e-9, "0.01"),
    ("scrape", "timeout_s", 1e-6, "0.001"),
    ("timeouts", "idle_s", 1e-9, "0.001"),
    ("timeouts", "stall_s", 1e-9, "0.001"),
    ("timeouts", "first_byte_s", 1e-9, "0.001"),
    ("timeouts", "stream_first_byte_s", 1e-9, "0.001"),
    ("timeouts", "connect_s", 1e-9, "0.001"),
    ("limits", "header_timeout_s", 1e-9, "0.001"),
    ("limits", "body_timeout_s", 1e-9, "0.001"),
    ("limits", "keep_alive_s", 1e-9, "0.001"),
])
def test_a_time_below_its_least_is_refused_naming_key_and_value(
        section: str, key: str, value: float, least: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config\.{section}: {key} must be at least "
                                          rf"{least} s, got {value!r}$"):
        parse_config({**REPLICAS, section: {key: value}})


def test_the_least_times_are_taken(tmp_path: Path) -> None:
    config = parse_config({**REPLICAS, "health": {"interval_s": 0.01, "timeout_s": 0.001},
                           "scrape": {"interval_s": 0.01},
                           "timeouts": {"idle_s": 0.001, "stall_s": 0.001}})
    assert (config.health.interval_s, config.scrape.interval_s) == (0.01, 0.01)
    assert config.timeouts.idle_s == 0.001
    bad = tmp_path / "gw.yaml"
    bad.write_text("replicas:\n  - {id: a, url: 'http://h:1'}\nhealth: {interval_s: 1.0e-9}\n")
    with pytest.raises(ConfigError, match=rf"^{bad}\.health: interval_s must be at least "
                                          r"0\.01 s, got 1e-09$"):
        load_config(bad)
