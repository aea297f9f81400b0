"""Strict construction of frozen config dataclasses from YAML mappings.

Unknown keys are rejected, values are type-checked, and every error names where it came
from (file and key path) and the bad value. Dataclasses may add a ``validate()`` method
that raises ``ValueError`` for cross-field rules; its message is wrapped the same way.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Hashable, Mapping
from typing import Any, NamedTuple, TypeVar, Union, get_args, get_origin

from kvwire.media_parts import shown

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or wrong; the message names it."""


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _by_type_tag(args: tuple[Any, ...]) -> dict[Any, Any]:
    """{tag: dataclass} when every non-None member of a union is a dataclass whose
    ``type`` field is a one-value ``Literal``; else empty."""
    tagged: dict[Any, Any] = {}
    for arg in args:
        if arg is type(None):
            continue
        if not dataclasses.is_dataclass(arg):
            return {}
        hint = typing.get_type_hints(arg).get("type")
        if get_origin(hint) is not typing.Literal or len(get_args(hint)) != 1:
            return {}
        tagged[get_args(hint)[0]] = arg
    return tagged


# fields whose values are secrets, and their ``_file`` and ``_env`` forms: a config error
# about a value in or under one names its type and length, never the value (an unquoted
# numeric token, or a key pasted into ``token_env``, would be printed to the logs whole)
_SECRET_FIELDS = frozenset({"token", "secret", "key", "api_key", "password"})
# sections that hold secrets: a value written in their place (``admin: sk-...``, a bare
# ``api_keys: [sk-...]``, an unknown key inside one) is not shown either; their other
# fields (``admin.host``) are
_SECRET_SECTIONS = frozenset({"admin", "auth", "api_keys"})


class _Secret(NamedTuple):
    """Why a value is not shown: ``field``, the key it is written under; ``deep``: a
    secret field, every value under it hidden (else a secret-bearing section, whose
    nested fields are judged by their own names)."""

    field: str
    deep: bool


def is_secret_key(name: str) -> bool:
    """Whether config key ``name`` holds a secret, or names the file or environment
    variable holding one (``token``, ``token_file``, ``api_key_env`` ...)."""
    return name.removesuffix("_file").removesuffix("_env") in _SECRET_FIELDS


def _secret_of(name: str, outer: _Secret | None) -> _Secret | None:
    """How a value under key ``name`` of a mapping in ``outer`` is hidden, if it is."""
    if outer is not None and outer.deep:
        return outer
    if is_secret_key(name):
        return _Secret(name, deep=True)
    return _Secret(name, deep=False) if name in _SECRET_SECTIONS else None


_NUMBER_CHARS = 60  # a quoted number longer than this is not told how to write it (_got)
_INT_BITS_SHOWN = 3321  # an integer shown whole has at most 1,000 digits (2**3321 < 10**1000)


def _named(value: Any) -> str:
    """``value`` as a config error names it, in a bounded message at a bounded cost:
    ``shown`` (a string's start, a list's length, a mapping's first keys; never a whole
    ``repr``, a megabyte long for a megabyte string, a RecursionError for a deeply nested
    list), but an integer of up to 1,000 digits whole (YAML reads a typo's extra digits
    as an int past a float's range: its digits tell which)."""
    if type(value) is int and value.bit_length() <= _INT_BITS_SHOWN:
        return repr(value)
    return shown(value)


def _show(value: Any, secret: _Secret | None) -> str:
    """``value`` as a config error shows it (``_named``), but for one in or under a secret
    field or section: its type and length."""
    if secret is None:
        return _named(value)
    size = f" and length {len(value):,}" if isinstance(value, str | list | tuple | Mapping) \
        else ""
    why = "is a secret" if secret.deep else "holds secrets"
    return f"a value of type {type(value).__name__}{size} (not shown: '{secret.field}' {why})"


def _coerce(value: Any, tp: Any, where: str, secret: _Secret | None) -> Any:
    """``value`` as type ``tp``; ``secret``: why errors must not show it (``_secret_of``)."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        tagged = _by_type_tag(args)
        if tagged:  # a union of dataclasses told apart by their ``type`` key
            if not isinstance(value, Mapping) or "type" not in value:
                raise ConfigError(f"{where}: expected a mapping with a 'type' key (one of "
                                  f"{', '.join(map(repr, tagged))}), got "
                                  f"{_show(value, secret)}")
            tag = value["type"]  # (a list or a mapping is no tag: it cannot be looked up)
            if not isinstance(tag, Hashable) or tag not in tagged:
                raise ConfigError(f"{where}.type: {_show(tag, _secret_of('type', secret))} "
                                  f"is not one of {', '.join(map(repr, tagged))}")
            return _from_mapping(tagged[tag], value, where, secret)
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where, secret)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {_show(value, secret)}")
    if origin is typing.Literal:
        if value not in get_args(tp):
            choices = ", ".join(repr(a) for a in get_args(tp))
            raise ConfigError(f"{where}: {_show(value, secret)} is not one of {choices}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {_show(value, secret)}")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{where}[{i}]", secret) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {_show(value, secret)}")
        return dict(value)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return _from_mapping(tp, value, where, secret)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_show(value, secret)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not _finite(value):  # YAML's .nan and .inf pass every bound check
            raise ConfigError(f"{where}: expected a finite number, got "
                              f"{_got(value, secret, integer=False)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got "
                              f"{_got(value, secret, integer=True)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_show(value, secret)}")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_show(value, secret)}")
    return value


def _finite(value: int | float) -> bool:
    """Whether ``value`` is a finite float (an integer past a float's range is not: YAML
    reads 400 digits as an int, which ``float()`` refuses with an ``OverflowError``)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _got(value: Any, secret: _Secret | None, integer: bool) -> str:
    """``value`` as an error about a number shows it: a string that reads as a number says
    how to write it so that YAML reads a number (YAML 1.1 reads ``1e300`` and ``1.0e300``
    as text: a float needs a dot and a signed exponent, ``1.0e+300``). A string longer
    than ``_NUMBER_CHARS`` is named as any other (``_named``): no number to rewrite. One
    in or under a secret field or section (``secret``) is not shown (``_show``)."""
    if secret is not None or not isinstance(value, str) or len(value) > _NUMBER_CHARS:
        return _show(value, secret)
    try:
        number = float(value.replace("_", ""))
    except ValueError:
        return _named(value)
    if not math.isfinite(number):
        return _named(value)
    mantissa, e, exponent = value.strip().lower().partition("e")
    if integer and number.is_integer() and abs(number) < 1e18:
        fix = f"write it as {int(number)}"
    elif integer:
        fix = "write a whole number"
    elif e:
        if "." not in mantissa:
            mantissa += ".0"
        if exponent[:1] not in ("+", "-"):
            exponent = "+" + exponent
        fix = f"write it as {mantissa}e{exponent} or as a smaller number"
    else:
        fix = "write it without quotes"
    why = "YAML reads a number with an exponent as text unless it has a dot and a signed " \
        "exponent" if e else "quoted, it is text"
    return f"the string {_named(value)} ({why}: {fix})"


def from_mapping(cls: type[T], data: Any, where: str = "config") -> T:
    """Build dataclass ``cls`` from ``data``, rejecting unknown keys and bad values."""
    return _from_mapping(cls, data, where, None)


def _from_mapping(cls: Any, data: Any, where: str, secret: _Secret | None) -> Any:
    """``from_mapping``, for a mapping in or under a secret field or section (``secret``):
    its errors do not show its values."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {_show(data, secret)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    # by repr: YAML keys need not be strings (``1:``, ``on:`` read as an int, a bool)
    unknown = sorted(set(data) - set(fields), key=repr)
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"{where}: unknown key {_show(unknown[0], secret)} (known keys: "
                          f"{known})")
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], f"{where}.{name}",
                                   _secret_of(name, secret))
        elif (
            field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
        ):
            raise ConfigError(f"{where}: missing required key {name!r}")
    try:
        obj = cls(**kwargs)
        validate = getattr(obj, "validate", None)
        if validate is not None:
            validate()
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return obj
