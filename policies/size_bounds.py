"""Upper bounds on the policy settings that size what a policy builds (rings, pieces,
windows, blocks): past them a setting is a typo, and taken as written it would build a
ring of 10^12 points on the first request or hold a window of 10^12 prompts. Each bound is
far above any fleet's need: the presets use a few percent of it at most."""

from __future__ import annotations

SIZE_BOUNDS: dict[str, int] = {
    "vnodes": 4096,  # ring points per replica per unit of weight (weight <= 100)
    "prefix_tokens": 1 << 20,
    "block_chunks": 1 << 12,
    "key_chunks": 1 << 16,
    "max_chunks": 1 << 20,
    "chunk_chars": 1 << 16,
    "homes": 1024,
    "fallbacks": 1024,
    "min_scratch": 1024,
    "common_window": 1 << 16,
    "common_block": 1 << 16,
    "common_min_samples": 1 << 16,
    "max_common_prefix": 1 << 20,
    "common_lookahead": 1 << 16,
    "kv_block_size": 1 << 12,
    "block_size": 1 << 12,
    "min_match_tokens": 1 << 24,
    "default_capacity_tokens": 1 << 36,
}


def check_sizes(cfg: object) -> None:
    """``ValueError`` naming the first setting of ``cfg`` above its ``SIZE_BOUNDS``."""
    for key, bound in SIZE_BOUNDS.items():
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > bound:
            raise ValueError(f"{key} must be at most {bound}, got {value!r}")
