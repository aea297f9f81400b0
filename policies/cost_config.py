"""The ``cost`` policy's settings (``presets/cost.yaml`` says what each key means),
validated on construction by the registry (``validate``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.common_prefix import check_settings
from policies.size_bounds import check_sizes

_MIN_SKETCH_WIDTH, _MAX_SKETCH_WIDTH = 8, 1 << 24


@dataclass(frozen=True, slots=True)
class CostConfig:
    """See ``presets/cost.yaml`` for what each key means."""

    chunk_chars: int = 64
    block_chunks: int = 8
    key_chunks: int = 16
    max_chunks: int = 8192
    homes: int = 2
    spill_wait: float = 1.0
    hot_spread: float = 1.5
    vnodes: int = 256
    hot_min_count: int = 3
    hot_keep_count: int = 1
    window_factor: float = 4.0
    sketch_width: int = 1 << 16
    sketch_depth: int = 4
    min_scratch: int = 1
    max_scratch_fraction: float = 0.5
    scratch_utilization: float = 0.4
    max_scratch_utilization: float = 0.85
    load_window_s: float = 60.0
    eviction_weight: float = 0.5
    rare_eviction_weight: float = 2.0
    eviction_survival: bool = True
    scratch_loss: float = 0.5
    prefill_weight: float = 2.0
    fill_homes: bool = True
    common_head: bool = True
    slot_weight: float = 2.0
    tail_slack: float = 0.2
    tail_weight: float = 1.0
    placement_slack: float | None = 0.05
    placement_fill: float = 0.9
    placement_overflow: bool = True
    spill_survival: bool = True
    prefill_s_per_token: float = 1e-4
    slow_replica_ratio: float | None = 1.5
    balance_factor: float | None = 2.0
    balance_requests: float = 12.0
    early_balance_requests: float | None = 4.0
    capacity_fraction: float = 1.0
    default_capacity_tokens: int = 200_000
    learn_common_prefix: bool = True
    common_share: float = 0.5
    common_window: int = 1024
    common_block: int = 8
    common_min_samples: int = 64
    max_common_prefix: int = 512
    common_lookahead: int = 128
    kv_events: bool = True
    kv_block_size: int = 16
    kv_event_grace_s: float = 5.0

    def validate(self) -> None:
        check_settings(self)
        check_sizes(self)
        for key in ("chunk_chars", "block_chunks", "key_chunks", "max_chunks", "homes", "vnodes",
                    "hot_min_count", "default_capacity_tokens", "common_lookahead",
                    "kv_block_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)!r}")
        for key in ("window_factor", "scratch_utilization", "max_scratch_utilization",
                    "load_window_s", "spill_wait",
                    "hot_spread", "prefill_weight",
                    "prefill_s_per_token", "kv_event_grace_s"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(self, key)!r}")
        if not 1 <= self.hot_keep_count <= self.hot_min_count:
            raise ValueError(f"hot_keep_count must be in [1, hot_min_count "
                             f"({self.hot_min_count})], got {self.hot_keep_count!r}")
        if self.max_scratch_utilization < self.scratch_utilization:
            # (the scratch set "runs hotter" up to it when the hot prefixes need the room)
            raise ValueError(f"max_scratch_utilization must be >= scratch_utilization "
                             f"({self.scratch_utilization!r}), got "
                             f"{self.max_scratch_utilization!r}")
        if self.min_scratch < 0:
            raise ValueError(f"min_scratch must be >= 0, got {self.min_scratch!r}")
        if not 0.0 <= self.max_scratch_fraction < 1.0:
            raise ValueError(
                f"max_scratch_fraction must be in [0, 1), got {self.max_scratch_fraction!r}")
        for key in ("eviction_weight", "rare_eviction_weight", "scratch_loss", "slot_weight",
                    "tail_slack", "tail_weight"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)!r}")
        if self.placement_slack is not None and not self.placement_slack >= 0:
            raise ValueError(f"placement_slack must be >= 0 or null, got {self.placement_slack!r}")
        if self.balance_factor is not None and not self.balance_factor >= 1.0:
            raise ValueError(f"balance_factor must be >= 1 or null, got "
                             f"{self.balance_factor!r}")
        if not 0.0 <= self.balance_requests < math.inf:
            raise ValueError(f"balance_requests must be a number >= 0, got "
                             f"{self.balance_requests!r}")
        if self.early_balance_requests is not None \
                and not 0.0 <= self.early_balance_requests < math.inf:
            raise ValueError(f"early_balance_requests must be a number >= 0 or null, got "
                             f"{self.early_balance_requests!r}")
        if self.slow_replica_ratio is not None and not self.slow_replica_ratio >= 1.0:
            raise ValueError(f"slow_replica_ratio must be >= 1 or null, got "
                             f"{self.slow_replica_ratio!r}")
        if not 0.0 < self.placement_fill <= 1.0:
            raise ValueError(f"placement_fill must be in (0, 1], got {self.placement_fill!r}")
        if not 0.0 < self.capacity_fraction <= 1.0:
            raise ValueError(
                f"capacity_fraction must be in (0, 1], got {self.capacity_fraction!r}")
        # at least 8: the sketch halves every sketch_width // 8 adds at most, and that many
        # hot keys are placed; at most 2^24 (64 MiB a row): past it a typo
        if not _MIN_SKETCH_WIDTH <= self.sketch_width <= _MAX_SKETCH_WIDTH \
                or self.sketch_width & (self.sketch_width - 1):
            raise ValueError(f"sketch_width must be a power of two in [{_MIN_SKETCH_WIDTH}, "
                             f"{_MAX_SKETCH_WIDTH}], got {self.sketch_width!r}")
        if not 1 <= self.sketch_depth <= 8:
            raise ValueError(f"sketch_depth must be in [1, 8], got {self.sketch_depth!r}")
