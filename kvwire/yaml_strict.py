"""YAML as the project reads its config files: PyYAML's safe loader, with a key written
twice in one mapping refused (PyYAML keeps the last value silently, so an operator's
second ``port:`` would quietly win over the first)."""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode


class DuplicateKey(yaml.YAMLError):
    """A mapping has one key twice; the message names the key and both lines."""


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # "<<: *defaults": the merged keys may be written again, by design
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: the constructor below says so
            if first is not None:
                raise DuplicateKey(f"line {line}: key {key!r} appears twice in one mapping "
                                   f"(first on line {first})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, refusing a key written twice in one mapping
    (``DuplicateKey``, a ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
