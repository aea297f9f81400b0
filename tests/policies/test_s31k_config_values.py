"""``config.from_mapping`` names a bad value in a bounded message: a megabyte string or a
deeply nested value (a YAML file's, an admin API body's) is described, never printed
whole (a megabyte error) nor walked to its depth (a RecursionError)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import pytest

from policies.config import ConfigError, from_mapping

_HUGE = "x" * 1_000_000


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


@dataclass(frozen=True, slots=True)
class _Dns:
    type: Literal["dns"] = "dns"


@dataclass(frozen=True, slots=True)
class _Kube:
    type: Literal["kubernetes"] = "kubernetes"


@dataclass(frozen=True, slots=True)
class _Settings:
    ratio: float = 1.0
    count: int = 1
    name: str = "a"
    mode: Literal["fast", "slow"] = "fast"
    names: tuple[str, ...] = ()
    source: _Dns | _Kube | None = None
    sub: _Dns | None = None


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        from_mapping(_Settings, data, "gateway.yaml")
    message = str(caught.value)
    assert len(message) < 300, message[:300]
    return message


@pytest.mark.parametrize(("data", "expected"), [
    ({"ratio": _HUGE}, "gateway.yaml.ratio: expected a finite number, got 'xxx"),
    ({"count": "1" * 1_000_000}, "gateway.yaml.count: expected an integer, got '111"),
    ({"ratio": "0." + "0" * 100_000 + "1e5"}, "gateway.yaml.ratio: expected a finite "
                                               "number, got '0.000"),
    ({"mode": _HUGE}, "gateway.yaml.mode: 'xxx"),
    ({"names": ["a", _HUGE, 1]}, "gateway.yaml.names[2]: expected a string, got 1"),
    ({_HUGE: 1}, "gateway.yaml: unknown key 'xxx"),
    ({"source": {"type": _HUGE}}, "gateway.yaml.source.type: 'xxx"),
    ({"sub": _HUGE}, "gateway.yaml.sub: expected a mapping with a 'type' key (one of "
                     "'dns'), got 'xxx"),
    (_HUGE, "gateway.yaml: expected a mapping, got 'xxx"),
])
def test_a_huge_value_is_named_by_its_start(data: Any, expected: str) -> None:
    message = _error(data)
    assert message.startswith(expected)
    assert "..." in message or expected.endswith("got 1")  # cut, and said so


def test_a_big_container_is_named_by_its_size() -> None:
    assert _error({"name": [_HUGE] * 1000}) == \
        "gateway.yaml.name: expected a string, got an array of 1000"
    assert _error({"names": ["a", {str(i): _HUGE for i in range(9)}]}) == \
        "gateway.yaml.names[1]: expected a string, got an object {'0', '1', '2', '3', ...}"


@pytest.mark.parametrize(("data", "expected"), [
    ({"count": _deep(100_000)}, "gateway.yaml.count: expected an integer, got an array of 1"),
    ({"name": _deep(100_000)}, "gateway.yaml.name: expected a string, got an array of 1"),
    ({"mode": _deep(100_000)}, "gateway.yaml.mode: an array of 1 is not one of 'fast', "
                               "'slow'"),
    ({"source": _deep(100_000)}, "gateway.yaml.source: expected a mapping with a 'type' "
                                 "key"),
    (_deep(100_000), "gateway.yaml: expected a mapping, got an array of 1"),
])
def test_a_deeply_nested_value_is_named_without_walking_it(data: Any, expected: str) -> None:
    assert _error(data).startswith(expected)


def test_a_tag_that_is_no_value_is_named() -> None:
    # a list as a tagged union's ``type``: it was looked up, a TypeError naming nothing
    assert _error({"source": {"type": ["dns"]}}) == (
        "gateway.yaml.source.type: an array of 1 is not one of 'dns', 'kubernetes'")
    assert _error({"source": {"type": {"dns": 1}}}).startswith(
        "gateway.yaml.source.type: an object {'dns'} is not one of")


def test_short_values_are_named_whole() -> None:
    assert _error({"mode": "quick"}) == "gateway.yaml.mode: 'quick' is not one of 'fast', " \
                                        "'slow'"
    assert _error({"count": "12"}).startswith("gateway.yaml.count: expected an integer, got "
                                              "the string '12' (")
    with pytest.raises(ConfigError) as caught:  # a typo's extra digits: all shown
        from_mapping(_Settings, {"ratio": 10 ** 500}, "gateway.yaml")
    assert str(caught.value) == "gateway.yaml.ratio: expected a finite number, got 1" \
        + "0" * 500
    assert from_mapping(_Settings, {"source": {"type": "dns"}}).source == _Dns()
