"""The configuration's documented example (``gateway.config``'s docstring) names every key
the gateway reads: a key added to the config and not to the example is one an operator
cannot find."""

from __future__ import annotations

import dataclasses
import typing

import yaml

import gateway.config as config_module
from gateway.config import GatewayConfig

# a secret is given one way of three: the example shows the ``_env`` one, and says so
_ALTERNATIVES = {"token", "token_file", "secret", "secret_file", "key", "key_file"}


def _example() -> dict[str, typing.Any]:
    doc = config_module.__doc__
    assert doc is not None
    block = doc.split("::", 1)[1]
    loaded = yaml.safe_load("\n".join(line[4:] for line in block.splitlines()))
    assert isinstance(loaded, dict)
    return loaded


def _missing(cls: type, shown: dict[str, typing.Any], path: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name not in shown:
            if f.name not in _ALTERNATIVES:
                out.append(path + f.name)
            continue
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind) and isinstance(shown[f.name], dict):
            out += _missing(typing.cast(type, kind), shown[f.name], f"{path}{f.name}.")
    return out


def test_the_example_names_every_key() -> None:
    assert _missing(GatewayConfig, _example(), "") == []


def test_the_example_names_no_key_the_config_lacks() -> None:
    names = {f.name for f in dataclasses.fields(GatewayConfig)}
    assert set(_example()) - names == set()
