"""Building a policy from its YAML mapping: ``{name: <policy>, <param>: <value>, ...}``.

    policy = build_policy({"name": "prefix_affinity", "overload": 1.5})
    policy = build_policy(load_preset("radix"))

Each policy's parameters are a frozen dataclass, validated strictly by ``config.from_mapping``
(unknown keys and bad values raise ``ConfigError`` naming the key and the value). Every
policy has a preset in ``presets/<name>.yaml`` with its defaults and what they mean.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from kvwire import yaml_strict
from policies.base import Policy
from policies.config import ConfigError, from_mapping
from policies.cost import Cost, CostConfig
from policies.kv_events import KVEvents, KVEventsConfig
from policies.least_load import LeastLoad, LeastLoadConfig
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.radix import Radix, RadixConfig
from policies.round_robin import RoundRobin, RoundRobinConfig

_POLICIES: dict[str, tuple[type, Callable[[Any], Policy]]] = {
    "round_robin": (RoundRobinConfig, RoundRobin),
    "least_load": (LeastLoadConfig, LeastLoad),
    "prefix_affinity": (PrefixAffinityConfig, PrefixAffinity),
    "radix": (RadixConfig, Radix),
    "kv_events": (KVEventsConfig, KVEvents),
    "cost": (CostConfig, Cost),
}

POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


def build_policy(config: Mapping[str, Any], where: str = "policy") -> Policy:
    """A new policy object from ``{name: ..., <params>}``; ``ConfigError`` if invalid."""
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: expected a mapping with a 'name' key, got {config!r}")
    if "name" not in config:
        known = ", ".join(POLICY_NAMES)
        raise ConfigError(f"{where}: missing required key 'name' (one of {known})")
    name = config["name"]
    if not isinstance(name, str) or name not in _POLICIES:
        raise ConfigError(
            f"{where}.name: unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})"
        )
    config_cls, policy_cls = _POLICIES[name]
    params = {k: v for k, v in config.items() if k != "name"}
    return policy_cls(from_mapping(config_cls, params, where))


def load_preset(name: str) -> dict[str, Any]:
    """The mapping in ``presets/<name>.yaml`` (with its ``name`` key); ``ConfigError`` for
    an unknown preset."""
    if name not in _POLICIES:
        raise ConfigError(f"preset: unknown preset {name!r} (known: {', '.join(POLICY_NAMES)})")
    text = resources.files("policies").joinpath("presets", f"{name}.yaml").read_text("utf-8")
    data = yaml_strict.safe_load(text)
    if not isinstance(data, dict):
        raise ConfigError(f"preset {name}.yaml: expected a mapping, got {data!r}")
    return data
