"""A policy named with its settings on a command line: ``name:key=value:key=value`` (values
in YAML), as ``bench_proxy --cpu-policies`` and ``loadtests.run --policies`` take them."""

from __future__ import annotations

import yaml


def policy_spec(spec: str) -> dict[str, object]:
    """``name`` or ``name:key=value:key=value`` (values in YAML) as a policy mapping:
    ``prefix_affinity:chunk_chars=0`` is prefix_affinity keyed on token ids."""
    name, *settings = spec.split(":")
    out: dict[str, object] = {"name": name}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise ValueError(f"policy setting {setting!r} of {spec!r}: expected key=value")
        out[key] = yaml.safe_load(value)
    return out
