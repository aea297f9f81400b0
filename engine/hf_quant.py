"""The memory of a model's weights as its checkpoint stores them, from the
``quantization_config`` of its Hugging Face ``config.json`` (``kvgate plan``).

``weight_memory`` sizes all but the embeddings and output head at the bytes a
quantized weight takes, its scales' share included, which the reader ``_READERS``
keeps for its ``quant_method`` works out; the embeddings and output head stay at the
config's dtype. ``engine.hf_shape`` finds the section, counts the parameters and calls
it; this module reads no parameter counts or dtypes itself, and ``ConfigSection`` (a
mapping of ``config.json`` and where it is, which errors name) is shared with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from kvwire.media_parts import shown


@dataclass(frozen=True, slots=True)
class ConfigSection:
    """A mapping of ``config.json`` and where it is (``""``: the top level;
    ``"text_config."``, ``"quantization_config."``), which its errors name."""

    values: Mapping[str, Any]
    where: str = ""

    def positive(self, key: str, default: Any = None) -> int:
        """``key``'s value, a positive integer; ``default`` where it is absent or null."""
        value = self.values.get(key)
        if value is None:  # absent, or null as many configs write an unset head_dim
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"config.json {self.where}{key} must be a positive integer, "
                             f"got {shown(value)}")
        return value


class Weights(NamedTuple):
    """The memory a model's weights take as its checkpoint stores them: ``quantized`` of
    its ``params`` at ``bytes_per_quantized`` each (their scales' share included), the
    others (a quantized model's embeddings and output head; all of an unquantized
    model's) at ``dtype_bytes``; ``method``: the quantization's name (None: none)."""

    params: float
    quantized: float = 0.0
    bytes_per_quantized: float = 0.0
    dtype_bytes: int = 2
    method: str | None = None

    @property
    def total_bytes(self) -> float:
        return self.quantized * self.bytes_per_quantized \
            + (self.params - self.quantized) * self.dtype_bytes


def _bits(values: ConfigSection, key: str) -> int:
    """``key``'s weight width in bits, 1 to 16."""
    bits = values.positive(key)
    if bits > 16:
        raise ValueError(f"config.json {values.where}{key} must be at most 16 bits, got "
                         f"{shown(bits)}")
    return bits


def _group_scales(values: ConfigSection, bits: int, key: str,
                  symmetric: bool = False) -> tuple[float, str]:
    """A group's 16-bit scale and, where the group is asymmetric (GPTQ's either way),
    its ``bits``-bit zero point, as bytes a weight: ``(2 + bits / 8) / group``; none for
    a group of -1 (a scale per output channel, negligible). ``symmetric``: whether a
    section without the ``symmetric`` key is (compressed-tensors' default)."""
    group = values.values.get(key, 128)
    if group == -1:
        return 0.0, "a scale per channel"
    group = values.positive(key, 128)
    zero = bits / 8 if values.values.get("zero_point", True) is not False \
        and values.values.get("symmetric", symmetric) is not True else 0.0
    return (2 + zero) / group, \
        f"a 16-bit scale{' and zero point' if zero else ''} per {group} weights"


# A reader: the bytes a quantized weight takes, its scales' share included, and how they
# are counted, from the quantization section and the config's dtype bytes.
Reader = Callable[[ConfigSection, int], tuple[float, str]]


def _fp8(quant: ConfigSection, dtype: int) -> tuple[float, str]:
    """fp8 and fbgemm_fp8: 1 B a weight, and DeepSeek-V3's float32 block scales."""
    block = quant.values.get("weight_block_size")
    if block is None:  # a scale per tensor or per channel
        return 1.0, "8-bit weights, a scale per tensor or channel"
    if not (isinstance(block, list) and len(block) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in block)):
        raise ValueError(f"config.json {quant.where}weight_block_size must be two "
                         f"positive integers, got {shown(block)}")
    # DeepSeek-V3's: a float32 scale per 128 x 128 block
    return 1 + 4 / (block[0] * block[1]), \
        f"8-bit weights, a 4 B scale per {block[0]} x {block[1]} block"


def _awq_gptq(quant: ConfigSection, dtype: int) -> tuple[float, str]:
    """AWQ and GPTQ: their bits, and a scale (and zero point) per group."""
    old = "bits" not in quant.values and "w_bit" in quant.values  # AutoAWQ's older
    bits = _bits(quant, "w_bit" if old else "bits")  # configs: w_bit, q_group_size
    scales, said = _group_scales(quant, bits, "q_group_size" if old else "group_size")
    return bits / 8 + scales, f"{bits}-bit weights, {said}"


def _compressed_tensors(quant: ConfigSection, dtype: int) -> tuple[float, str]:
    """The widest weights of a ``compressed-tensors`` config's ``config_groups``, as
    every quantized module's; a group quantizing only activations: ``dtype`` bytes."""
    groups = quant.values.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise ValueError(f"config.json {quant.where}config_groups must be an object of "
                         f"quantization schemes, got {shown(groups)}")
    widest = (0.0, "")
    for name, scheme in groups.items():
        where = f"{quant.where}config_groups.{name}"
        if not isinstance(scheme, Mapping):
            raise ValueError(f"config.json {where} must be an object, got "
                             f"{shown(scheme)}")
        if scheme.get("weights") is None:
            widest = max(widest, (float(dtype), f"{8 * dtype}-bit weights"))
            continue
        if not isinstance(scheme["weights"], Mapping):
            raise ValueError(f"config.json {where}.weights must be an object, got "
                             f"{shown(scheme['weights'])}")
        weights = ConfigSection(scheme["weights"], f"{where}.weights.")
        bits = _bits(weights, "num_bits")
        # group: W4A16's; tensor_group: NVFP4's (its fp8 scales counted as 16-bit, an
        # upper bound); tensor, channel, block: scales negligible
        if weights.values.get("strategy") in ("group", "tensor_group"):
            # symmetric unless it says not, as compressed-tensors' QuantizationArgs
            scales, said = _group_scales(weights, bits, "group_size", symmetric=True)
        else:
            scales, said = 0.0, "scales per tensor, channel or block"
        widest = max(widest, (bits / 8 + scales, f"{bits}-bit weights, {said}"))
    return widest


def _bitsandbytes(quant: ConfigSection, dtype: int) -> tuple[float, str]:
    """bitsandbytes 4-bit (a float32 absmax per 64 weights, or double-quantized an 8-bit
    one and a float32 per 256 of them) or 8-bit; neither: ``dtype`` bytes."""
    if quant.values.get("load_in_4bit"):
        double = bool(quant.values.get("bnb_4bit_use_double_quant"))
        return 0.5 + (1 / 64 + 4 / (64 * 256) if double else 4 / 64), \
            "4-bit weights, an absmax per 64 weights"
    if quant.values.get("load_in_8bit"):
        return 1.0, "8-bit weights, a scale per row"
    return float(dtype), "neither load_in_4bit nor load_in_8bit"


def _mxfp4(quant: ConfigSection, dtype: int) -> tuple[float, str]:
    """gpt-oss' experts: 4-bit with an 8-bit scale per 32 weights."""
    return 0.5 + 1 / 32, "4-bit weights, an 8-bit scale per 32 weights"


# each quant_method read, and its reader; any other is counted at the dtype's bytes
_READERS: dict[str, Reader] = {
    "fp8": _fp8, "fbgemm_fp8": _fp8, "awq": _awq_gptq, "gptq": _awq_gptq,
    "compressed-tensors": _compressed_tensors, "bitsandbytes": _bitsandbytes,
    "mxfp4": _mxfp4,
}
QUANT_METHODS = tuple(_READERS)


def quantization_config(*sections: ConfigSection) -> ConfigSection | None:
    """The quantization the first of ``sections`` to give one keeps
    (``quantization_config``, ``compression_config`` in older compressed-tensors
    checkpoints), named where it is; None: none."""
    for section in sections:
        for key in ("quantization_config", "compression_config"):
            quant = section.values.get(key)
            if quant is None:
                continue
            if not isinstance(quant, Mapping):
                raise ValueError(f"config.json {section.where}{key} must be an object, "
                                 f"got {shown(quant)}")
            return ConfigSection(quant, f"{section.where}{key}.")
    return None


def weight_memory(quant: ConfigSection | None, params: float, embeddings: float | None,
                  dtype: int) -> tuple[Weights, tuple[str, ...]]:
    """The memory of ``params`` weights of ``dtype`` bytes quantized as ``quant`` says
    (None: not quantized), and what it assumed (notes for ``kvgate plan``). All but the
    ``embeddings`` (the embeddings' and output head's parameters; None where the config
    cannot tell them apart, without ``vocab_size``: counted quantized too) are stored
    quantized, at the bytes the reader of its ``quant_method`` gives (fp8; AWQ, GPTQ,
    compressed-tensors and bitsandbytes at their bits with their scales' share; gpt-oss'
    mxfp4); the embeddings and output head stay at the dtype, as these checkpoints keep
    them. Other modules a checkpoint leaves unquantized (a router, norms, its ignore
    list: a few percent of the weights in the published checkpoints) are counted
    quantized.

    An unknown ``quant_method`` is counted unquantized, at the dtype's bytes, with a note
    naming it, rather than refused: the plan's KV figures and routing advice do not
    depend on the weights (the idle KV is given), and the dtype's size is an upper bound
    on them, the side a memory plan can safely be wrong on."""
    if quant is None:
        return Weights(params, dtype_bytes=dtype), ()
    method = quant.values.get("quant_method")
    reader = _READERS.get(method) if isinstance(method, str) else None
    if reader is None:
        return Weights(params, dtype_bytes=dtype), (
            f"config.json {quant.where}quant_method {shown(method)} is not one the plan "
            f"reads ({', '.join(QUANT_METHODS)}): its weights are counted unquantized, at "
            f"{dtype} B a parameter, an upper bound",)
    per_weight, said = reader(quant, dtype)
    if embeddings is None:
        kept = 0.0
        where_kept = "vocab_size absent: its embeddings and output head are counted " \
            "quantized too"
    else:  # the embeddings and output head, at the dtype's bytes
        kept = min(params, embeddings)
        where_kept = f"its embeddings and output head ({kept / 1e9:,.2f}B) at {dtype} B"
    return Weights(params, params - kept, per_weight, dtype, method), (
        f"weights quantized ({method}: {said}; {per_weight:.4g} B a weight in all); "
        f"{where_kept}; any other module the checkpoint leaves unquantized (a router, "
        "norms, its ignore list) counted quantized",)
