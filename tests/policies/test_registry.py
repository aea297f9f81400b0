import dataclasses

import pytest
import yaml

from policies.base import Policy
from policies.config import ConfigError
from policies.registry import _POLICIES, POLICY_NAMES, build_policy, load_preset


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_preset_builds_and_documents_the_defaults(name: str) -> None:
    preset = load_preset(name)
    policy = build_policy(preset)
    assert isinstance(policy, Policy) and policy.name == name
    config_cls, _ = _POLICIES[name]
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    assert set(preset) - {"name"} == set(defaults), "preset must list every key"
    for key, value in defaults.items():
        assert preset[key] == value, f"{name}.{key}: preset {preset[key]!r} != default {value!r}"


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"name": "nope"}, "'nope'"),
        ({}, "'name'"),
        ({"name": "radix", "cache_treshold": 0.3}, "'cache_treshold'"),
        ({"name": "prefix_affinity", "overload": "high"},
         "policy.overload: expected a finite number"),
        ({"name": "prefix_affinity", "overload": 0.9}, "overload must be >= 1.0, got 0.9"),
        ({"name": "prefix_affinity", "prefix_tokens": 0}, "prefix_tokens must be >= 1, got 0"),
        ({"name": "prefix_affinity", "learn_common_prefix": "yes"}, "learn_common_prefix"),
        ({"name": "radix", "capacity_fraction": 1.5}, "capacity_fraction must be in (0, 1]"),
        ({"name": "least_load", "seed": 1.5}, "policy.seed: expected an integer, got 1.5"),
        ({"name": "round_robin", "seed": 1}, "'seed'"),
        ({"name": ["cost"]}, "unknown policy ['cost']"),
        ({"name": "cost", "tail_weight": float("nan")}, "expected a finite number, got nan"),
        ({"name": "radix", "max_tree_mb": float("inf")}, "expected a finite number, got inf"),
        ({"name": "prefix_affinity", "key_rungs": 10**8}, "key_rungs must be at most 64"),
    ],
)
def test_bad_config_names_the_key_and_value(config: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_policy(config)
    assert fragment in str(info.value)


def test_yaml_round_trip_and_where() -> None:
    data = yaml.safe_load("policy: {name: prefix_affinity, overload: 1.5, vnodes: 64}")
    policy = build_policy(data["policy"])
    assert policy.config.overload == 1.5 and policy.config.vnodes == 64
    with pytest.raises(ConfigError, match=r"^gateway.yaml:policy.vnodes: expected an integer"):
        build_policy({"name": "prefix_affinity", "vnodes": "many"}, where="gateway.yaml:policy")


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="'fastest'"):
        load_preset("fastest")


@pytest.mark.parametrize("name, key", [("prefix_affinity", "vnodes"), ("cost", "vnodes"),
                                       ("cost", "max_chunks"), ("radix", "chunk_chars"),
                                       ("kv_events", "block_size"),
                                       ("prefix_affinity", "common_window")])
def test_a_setting_that_sizes_what_a_policy_builds_is_bounded(name: str, key: str) -> None:
    # taken as written, vnodes 10^12 built a ring of 10^12 points on the first request
    with pytest.raises(ConfigError, match=rf"{key} must be at most \d+, got 1000000000000"):
        build_policy({**load_preset(name), key: 10**12})
