"""``config.from_mapping``: what a YAML file can hold that a Python caller would not write."""

from dataclasses import dataclass

import pytest

from kvwire import yaml_strict
from policies.config import ConfigError, from_mapping


@dataclass(frozen=True, slots=True)
class _Settings:
    ratio: float = 1.0
    count: int = 1


def test_keys_yaml_reads_as_numbers_or_booleans_are_named() -> None:
    # ``2:`` and ``on:`` are an int and a bool to YAML: two such unknown keys among string
    # ones were sorted against them, a TypeError naming nothing
    data = yaml_strict.safe_load("ratio: 2.0\n2: x\non: y\nratoi: 3\n")
    with pytest.raises(ConfigError, match=r"^gateway.yaml: unknown key .+ \(known keys: "
                                          r"count, ratio\)$"):
        from_mapping(_Settings, data, "gateway.yaml")


def test_an_integer_past_a_floats_range_is_named_with_its_key() -> None:
    # YAML reads 400 digits as an int; float() of it raised OverflowError, naming no key
    data = yaml_strict.safe_load("ratio: 1" + "0" * 400 + "\n")
    with pytest.raises(ConfigError, match=r"^gateway.yaml.ratio: expected a finite number, "
                                          r"got 10{400}$"):
        from_mapping(_Settings, data, "gateway.yaml")
    assert from_mapping(_Settings, {"ratio": 10**300}).ratio == 1e300  # in range: taken
