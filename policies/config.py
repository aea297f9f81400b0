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
from typing import Any, TypeVar, Union, get_args, get_origin

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


# fields whose values are secrets: a config error names their type, never the value (an
# unquoted numeric token in the YAML would be printed to the logs whole)
_SECRET_FIELDS = frozenset({"token", "secret", "key", "api_key", "password"})


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


def _show(value: Any, where: str) -> str:
    """``value`` as a config error shows it (``_named``), but for a secret field's."""
    field = where.rsplit(".", 1)[-1].split("[", 1)[0]
    if field in _SECRET_FIELDS:
        return f"a value of type {type(value).__name__} (not shown: '{field}' is a secret)"
    return _named(value)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        tagged = _by_type_tag(args)
        if tagged:  # a union of dataclasses told apart by their ``type`` key
            if not isinstance(value, Mapping) or "type" not in value:
                raise ConfigError(f"{where}: expected a mapping with a 'type' key (one of "
                                  f"{', '.join(map(repr, tagged))}), got {_show(value, where)}")
            tag = value["type"]  # (a list or a mapping is no tag: it cannot be looked up)
            if not isinstance(tag, Hashable) or tag not in tagged:
                raise ConfigError(f"{where}.type: {_named(tag)} is not one of "
                                  f"{', '.join(map(repr, tagged))}")
            return from_mapping(tagged[tag], value, where)
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: bad value {_show(value, where)}")
    if origin is typing.Literal:
        if value not in get_args(tp):
            choices = ", ".join(repr(a) for a in get_args(tp))
            raise ConfigError(f"{where}: {_show(value, where)} is not one of {choices}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {_show(value, where)}")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {_show(value, where)}")
        return dict(value)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where)  # type: ignore[type-var,arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {_show(value, where)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not _finite(value):  # YAML's .nan and .inf pass every bound check
            raise ConfigError(f"{where}: expected a finite number, got "
                              f"{_got(value, integer=False)}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {_got(value, integer=True)}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {_show(value, where)}")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {_show(value, where)}")
    return value


def _finite(value: int | float) -> bool:
    """Whether ``value`` is a finite float (an integer past a float's range is not: YAML
    reads 400 digits as an int, which ``float()`` refuses with an ``OverflowError``)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _got(value: Any, integer: bool) -> str:
    """``value`` as an error about a number shows it: a string that reads as a number says
    how to write it so that YAML reads a number (YAML 1.1 reads ``1e300`` and ``1.0e300``
    as text: a float needs a dot and a signed exponent, ``1.0e+300``). A string longer
    than ``_NUMBER_CHARS`` is named as any other (``_named``): no number to rewrite."""
    if not isinstance(value, str) or len(value) > _NUMBER_CHARS:
        return _named(value)
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
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {_named(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    # by repr: YAML keys need not be strings (``1:``, ``on:`` read as an int, a bool)
    unknown = sorted(set(data) - set(fields), key=repr)
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"{where}: unknown key {_named(unknown[0])} (known keys: {known})")
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], f"{where}.{name}")
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
