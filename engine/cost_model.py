"""Roofline step-time model for the sim executor, and its YAML profiles.

One step computes ``n_i`` new tokens for each sequence ``i`` at positions
``[s_i, s_i + n_i)`` (context ``c_i = s_i + n_i``)::

    flops = 2 * active_params * sum(n_i)                       (weights a token uses)
          + 4 * layers * heads * head_dim * sum(attended keys)  (QK^T and PV)
      attended keys of seq i = sum_{p = s_i}^{c_i - 1} (p + 1) = n_i * s_i + n_i (n_i + 1) / 2
    bytes = weight_bytes_read(sum(n_i))                        (weights, once per step:
            all of a dense model's; a mixture of experts' shared weights and the experts
            its tokens go to, ModelShape.weight_bytes_read; at the bytes the checkpoint
            stores them in, a quantized model's as ModelShape.weights counts them)
          + kv_bytes_per_token * sum(c_i + n_i)                 (read context, write new)
      kv_bytes_per_token = layers * (2 * kv_heads * head_dim, or an MLA latent's width)
                           * dtype_bytes
    seconds = max(flops / (peak * compute_eff), bytes / (bw * bandwidth_eff)) + overhead
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from engine.hf_quant import Weights
from engine.kv_sizing import window_blocks
from kvwire import yaml_strict

PROFILE_DIR = Path(__file__).parent / "profiles"


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    params: float
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2
    max_model_len: int = 8192
    # multi-head latent attention (DeepSeek-V2/V3): the values cached per token and layer,
    # one latent all heads share (kv_lora_rank + qk_rope_head_dim), in place of a K and a
    # V per KV head; None: ordinary attention
    mla_latent_width: int | None = None
    # a mixture of experts: the parameters one token computes with (None: all, a dense
    # model), of num_experts routed experts per MoE layer experts_per_token each
    active_params: float | None = None
    num_experts: int = 1
    experts_per_token: int = 1
    # layers attending only to the last sliding_window tokens (Mistral-7B-v0.1, Gemma 2
    # and 3's local layers): a cached prefix keeps only their window (kv_bytes_cached,
    # what kvgate plan sizes); kv_bytes_per_token, the roofline and the sim executor's KV
    # pool count them in full
    sliding_window: int | None = None
    sliding_window_layers: int = 0
    # the model's width, its embeddings' (config.json's hidden_size), where it is not
    # num_heads * head_dim: DeepSeek-V3's 7168 (MLA's heads attend over 128 x 192),
    # Gemma's; None: num_heads * head_dim, as Llama's
    model_dim: int | None = None
    # weights stored quantized (a config.json's quantization_config, engine.hf_quant):
    # quantized_params of the params at bytes_per_quantized_param each, their scales'
    # share included, the others at dtype_bytes; 0: none, every weight at dtype_bytes
    quantized_params: float = 0.0
    bytes_per_quantized_param: float = 0.0
    quantization: str | None = None

    def __post_init__(self) -> None:
        if not (_finite(self.params) and self.params > 0):
            raise ValueError(f"model.params must be a positive number, got {self.params!r}")
        active = self.active_params
        if active is not None and not (_finite(active) and 0 < active <= self.params):
            raise ValueError(f"model.active_params must be a number in (0, params="
                             f"{self.params:g}], got {active!r}")
        # counts: a float here made the KV block count a float (a TypeError at start)
        for key in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "dtype_bytes",
                    "max_model_len", "mla_latent_width", "num_experts",
                    "experts_per_token", "model_dim"):
            v = getattr(self, key)
            if v is None and key in ("mla_latent_width", "model_dim"):
                continue
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0):
                raise ValueError(f"model.{key} must be a positive integer, got {v!r}")
        swa = self.sliding_window_layers
        if isinstance(swa, bool) or not isinstance(swa, int) or not 0 <= swa <= self.num_layers:
            raise ValueError(f"model.sliding_window_layers must be an integer in [0, "
                             f"num_layers={self.num_layers}], got {swa!r}")
        window = self.sliding_window
        if swa and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            raise ValueError(f"model.sliding_window must be a positive integer with "
                             f"{swa} sliding_window_layers, got {window!r}")
        quantized = self.quantized_params
        if not (_finite(quantized) and 0 <= quantized <= self.params):
            raise ValueError(f"model.quantized_params must be a number in [0, params="
                             f"{self.params:g}], got {quantized!r}")
        per_weight = self.bytes_per_quantized_param
        if quantized and not (_finite(per_weight) and 0 < per_weight <= _MAX_WEIGHT_BYTES):
            raise ValueError(f"model.bytes_per_quantized_param must be a number in (0, "
                             f"{_MAX_WEIGHT_BYTES:g}] with {quantized:g} quantized_params, "
                             f"got {per_weight!r}")
        if self.quantization is not None and not isinstance(self.quantization, str):
            raise ValueError(f"model.quantization must be a string or null, got "
                             f"{self.quantization!r}")
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"model.experts_per_token {self.experts_per_token} is more "
                             f"than num_experts {self.num_experts}")
        # fewer active parameters than all: some experts a token is not sent to, whose
        # share weight_bytes_read takes as (1 - experts_per_token / num_experts)
        if active is not None and active < self.params \
                and self.num_experts <= self.experts_per_token:
            raise ValueError(f"model.active_params {active:g} below params "
                             f"{self.params:g} needs num_experts more than "
                             f"experts_per_token, got num_experts {self.num_experts} and "
                             f"experts_per_token {self.experts_per_token}")

    @property
    def hidden_size(self) -> int:
        """The model's width: its embeddings' (what the sim executor's are by default)."""
        return self.num_heads * self.head_dim if self.model_dim is None else self.model_dim

    @property
    def active(self) -> float:
        """The parameters one token computes with."""
        return self.params if self.active_params is None else self.active_params

    @property
    def weights(self) -> Weights:
        """The weights' memory as the checkpoint stores them: what ``kvgate plan`` prints
        beside the KV and what a step reads (``weight_bytes_read``)."""
        return Weights(self.params, self.quantized_params, self.bytes_per_quantized_param,
                       self.dtype_bytes, self.quantization)

    def weight_bytes_read(self, tokens: int) -> float:
        """The weight bytes a step of ``tokens`` tokens reads: every shared weight and the
        routed experts its tokens go to, at the bytes ``weights`` stores them in. With
        routing taken as uniform and independent, a token leaves a given expert out with
        chance ``1 - k / E``, so ``tokens`` of them use a share
        ``1 - (1 - k / E) ** tokens`` of the routed weights ``R``; a token's own
        ``active = params - R (1 - k / E)``, which leaves
        ``unused = (params - active) (1 - k / E) ** (tokens - 1)`` unread: all but
        ``active`` for one token, nearly none for a large batch. A dense model reads all
        of its weights."""
        unused = 0.0
        if self.active_params is not None:
            unused = (self.params - self.active_params) \
                * (1 - self.experts_per_token / self.num_experts) ** (tokens - 1)
        # the routed experts left unread are among the quantized weights where those are
        # as many (the embeddings and output head, the ones kept at the dtype, are no
        # expert's); past them, at the dtype: a checkpoint with experts left unquantized
        unread_quantized = min(unused, self.quantized_params)
        return self.weights.total_bytes - unread_quantized * self.bytes_per_quantized_param \
            - (unused - unread_quantized) * self.dtype_bytes

    @property
    def kv_values_per_token_layer(self) -> int:
        """The values one token caches in one layer: its latent (MLA), else a K and a V
        per KV head."""
        if self.mla_latent_width is not None:
            return self.mla_latent_width
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * self.kv_values_per_token_layer * self.dtype_bytes

    def kv_bytes_cached(self, tokens: int, block_size: int = 1) -> int:
        """The KV a cached prefix of ``tokens`` tokens keeps, in whole blocks of
        ``block_size`` tokens (1: token by token), as vLLM's hybrid KV cache manager keeps
        it: a full layer every block, a sliding-window layer only the blocks its window
        still reaches (``engine.kv_sizing.window_blocks``: ``min(tokens, window)`` tokens,
        and a block more in blocks of more than one token). Every layer's every block,
        ``tokens * kv_bytes_per_token`` in whole blocks, without window layers (or with
        vLLM's --disable-hybrid-kv-cache-manager)."""
        # [0, blocks) the prefix's blocks; a window layer keeps [blocks - kept, blocks)
        blocks = -(-tokens // block_size)
        kept = blocks if self.sliding_window is None else \
            window_blocks(blocks, self.sliding_window, block_size)
        per_layer_block = self.kv_values_per_token_layer * self.dtype_bytes * block_size
        full = self.num_layers - self.sliding_window_layers
        return per_layer_block * (full * blocks + self.sliding_window_layers * kept)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    peak_tflops: float
    hbm_tb_per_s: float
    compute_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8
    step_overhead_ms: float = 3.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "name" and not _finite(v):
                raise ValueError(f"gpu.{f.name} must be a finite number, got {v!r}")
        for key, (low, high) in _GPU_BOUNDS.items():
            if not low <= getattr(self, key) <= high:
                raise ValueError(f"gpu.{key} must be within [{low:g}, {high:g}] (a "
                                 f"device's), got {getattr(self, key)!r}")
        for key in ("compute_efficiency", "bandwidth_efficiency"):
            v = getattr(self, key)
            if not 0 < v <= 1:
                raise ValueError(f"gpu.{key} must be in (0, 1], got {v!r}")
        if not 0 <= self.step_overhead_ms <= MAX_STEP_OVERHEAD_MS:
            raise ValueError(f"gpu.step_overhead_ms must be within [0, "
                             f"{MAX_STEP_OVERHEAD_MS:g}] (a step's fixed cost is a few ms), "
                             f"got {self.step_overhead_ms}")


# what a device can be: past these a simulated step takes hours, and the engine stalls
_GPU_BOUNDS = {"peak_tflops": (0.01, 1e5), "hbm_tb_per_s": (0.001, 1e3)}
MAX_STEP_OVERHEAD_MS = 1000.0
MAX_SLOWDOWN = 100.0  # how many times slower than its profile's a device may be modelled
# a quantized weight's bytes, scales included: past a float32 and its scale and zero point
_MAX_WEIGHT_BYTES = 8.0


def _finite(v: object) -> bool:
    """Whether ``v`` is a finite int or float (YAML reads ``8e9`` as a string, ``.inf``
    as a float: an infinite step time would stall the engine for good)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    model: ModelShape
    gpu: GPUSpec


def _build(cls: type, section: str, data: Any) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"profile section {section!r} must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown keys in profile section {section!r}: {sorted(unknown)}")
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in data]
    if missing:
        raise ValueError(f"profile section {section!r} lacks keys {missing}")
    return cls(**data)


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    """A profile by name (``engine/profiles/<name>.yaml``) or by file path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(
            f"unknown profile {name_or_path!r}; available: {', '.join(available_profiles())}"
        )
    try:
        data = yaml_strict.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"profile {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"profile {path} must be a mapping")
    unknown = set(data) - {"name", "model", "gpu"}
    if unknown:
        raise ValueError(f"unknown keys in profile {path}: {sorted(unknown)}")
    return Profile(
        name=str(data.get("name", path.stem)),
        model=_build(ModelShape, "model", data.get("model")),
        gpu=_build(GPUSpec, "gpu", data.get("gpu")),
    )


class CostModel:
    def __init__(self, model: ModelShape, gpu: GPUSpec) -> None:
        self.model = model
        self.gpu = gpu
        self._flops_per_token = 2.0 * model.active
        self._attn_flops_per_key = 4.0 * model.num_layers * model.num_heads * model.head_dim
        self._kv_bytes = float(model.kv_bytes_per_token)
        self._flops_rate = gpu.peak_tflops * 1e12 * gpu.compute_efficiency
        self._bytes_rate = gpu.hbm_tb_per_s * 1e12 * gpu.bandwidth_efficiency
        self._overhead = gpu.step_overhead_ms / 1e3

    @classmethod
    def from_profile(cls, profile: Profile, slowdown: float = 1.0) -> CostModel:
        """``profile``'s model on its device, or on one ``slowdown`` times slower (its
        compute and memory bandwidth divided by it, its fixed step overhead multiplied): a
        fleet of mixed device generations, or a throttled one."""
        if not 0 < slowdown <= MAX_SLOWDOWN:  # NaN too
            raise ValueError(f"slowdown must be in (0, {MAX_SLOWDOWN:g}], got {slowdown!r}")
        gpu = profile.gpu
        if slowdown != 1.0:
            overhead = gpu.step_overhead_ms * slowdown
            if overhead > MAX_STEP_OVERHEAD_MS:
                raise ValueError(f"slowdown {slowdown:g} makes profile {profile.name!r}'s step "
                                 f"overhead {overhead:g} ms, past the "
                                 f"{MAX_STEP_OVERHEAD_MS:g} ms a profile may have")
            gpu = dataclasses.replace(gpu, peak_tflops=gpu.peak_tflops / slowdown,
                                      hbm_tb_per_s=gpu.hbm_tb_per_s / slowdown,
                                      step_overhead_ms=overhead)
        return cls(profile.model, gpu)

    def step_seconds(self, seqs: Iterable[tuple[int, int]]) -> float:
        """Modeled duration of a step over ``(start, num_new_tokens)`` pairs."""
        tokens = 0
        keys = 0
        kv_tokens = 0
        for s, n in seqs:
            tokens += n
            keys += n * s + n * (n + 1) // 2
            kv_tokens += s + 2 * n
        if tokens == 0:
            return 0.0
        flops = self._flops_per_token * tokens + self._attn_flops_per_key * keys
        nbytes = self.model.weight_bytes_read(tokens) + self._kv_bytes * kv_tokens
        return max(flops / self._flops_rate, nbytes / self._bytes_rate) + self._overhead
