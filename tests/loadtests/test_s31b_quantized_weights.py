"""Weights quantized in config.json (``quantization_config``) are sized as the checkpoint
stores them, not at 2 B a parameter: fp8 at 1 B, AWQ / GPTQ / compressed-tensors /
bitsandbytes at their bits with their scales' share, the embeddings and output head at
the config's dtype; an unknown method is counted unquantized, with a note naming it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.hf_shape import sizing_from_config
from loadtests.plan_report import render
from tests.support.model_configs import DEEPSEEK_V3, LLAMA3_8B
from tests.support.plan_runs import plan_for_config

GIB = 1 << 30
# Llama-3.1-8B's shapes (LLAMA3_8B's): embeddings and output head 2 x 128,256 x 4,096 =
# 1,050,673,152; a layer's attention 4,096 x 128 x (2 x 32 + 2 x 8) = 41,943,040 and MLP
# 3 x 4,096 x 14,336 = 176,160,768, x 32 layers = 6,979,321,856; 8,029,995,008 in all
EMBEDDINGS, LAYERS = 1_050_673_152, 6_979_321_856

# neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8's: fp8 weights, a scale per tensor
COMPRESSED_FP8 = {"quant_method": "compressed-tensors", "format": "naive-quantized",
                  "ignore": ["lm_head"], "quantization_status": "frozen",
                  "config_groups": {"group_0": {
                      "targets": ["Linear"],
                      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor",
                                  "symmetric": True, "dynamic": False, "group_size": None},
                      "input_activations": {"num_bits": 8, "type": "float",
                                            "strategy": "tensor", "symmetric": True,
                                            "dynamic": False}}}}
# neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w4a16's: int4 in groups of 128
COMPRESSED_W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                    "ignore": ["lm_head"], "config_groups": {"group_0": {
                        "targets": ["Linear"], "input_activations": None,
                        "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                    "group_size": 128, "symmetric": True}}}}
# hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4's and -GPTQ-INT4's
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
       "zero_point": True, "modules_to_not_convert": None}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True,
        "sym": True, "damp_percent": 0.01, "static_groups": False}
# unsloth/llama-3-8b-bnb-4bit's
BNB_4BIT = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16", "llm_int8_skip_modules": None}
# deepseek-ai/DeepSeek-V3's: fp8 with a float32 scale per 128 x 128 block
DEEPSEEK_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                "weight_block_size": [128, 128]}


@pytest.mark.parametrize(("quant", "per_weight", "total"), [
    # 6,979,321,856 x 1 + 1,050,673,152 x 2 = 9,080,668,160 B (8.46 GiB; 14.96 at 2 B)
    (COMPRESSED_FP8, 1.0, 9_080_668_160),
    # 4 bits and a 16-bit scale and 4-bit zero point per 128: 0.5 + 2.5 / 128 =
    # 0.51953125 B; 6,979,321,856 x 0.51953125 = 3,625,975,808, + 2,101,346,304
    (AWQ, 0.51953125, 5_727_322_112),
    (GPTQ, 0.51953125, 5_727_322_112),  # GPTQ stores its zero points even when sym
    # symmetric: a scale per 128 alone, 0.5 + 2 / 128 = 0.515625 B
    (COMPRESSED_W4A16, 0.515625, 5_700_059_136),
    # nf4 with its absmax per 64 in 8 bits and a float32 per 256 of those:
    # 0.5 + 1 / 64 + 4 / 16,384 = 0.515869140625 B
    (BNB_4BIT, 0.515869140625, 5_701_763_072),
], ids=["compressed-tensors-fp8", "awq", "gptq", "compressed-tensors-w4a16",
        "bitsandbytes-4bit"])
def test_quantized_weights_take_their_bytes(quant: dict[str, Any], per_weight: float,
                                            total: int) -> None:
    sizing = sizing_from_config({**LLAMA3_8B, "quantization_config": quant})
    weights = sizing.weights
    assert weights.params == EMBEDDINGS + LAYERS
    assert (weights.quantized, weights.bytes_per_quantized) == (LAYERS, per_weight)
    assert weights.total_bytes == pytest.approx(total, abs=1)
    assert sizing.shape.dtype_bytes == 2  # the KV stays bfloat16
    (note,) = sizing.notes
    assert note.startswith(f"weights quantized ({quant['quant_method']}: ")
    assert "its embeddings and output head (1.05B) at 2 B" in note


def test_deepseek_v3_fp8_blocks(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, {**DEEPSEEK_V3, "quantization_config": DEEPSEEK_FP8},
                           "--replicas", "2", "--idle-kv-gib", "25", "--sim-requests", "0")
    model = plan["model"]
    # 671,025,397,760 parameters, 2 x 129,280 x 7,168 = 1,853,358,080 of them embeddings;
    # 669,172,039,680 x (1 + 4 / 16,384) + 1,853,358,080 x 2 = 673,042,127,920 B
    # = 626.8 GiB, not the 1,249.9 GiB of 2 B a parameter
    assert model["params"] == 671_025_397_760
    assert model["weight_bytes"] == pytest.approx(673_042_127_920, abs=1)
    assert (model["quantization"], model["quantized_params"]) == ("fp8", 669_172_039_680)
    assert model["dtype_bytes"] == 2 and plan["kv_bytes_per_token"] == 61 * 576 * 2
    text = render(plan)
    assert ("weights              671.0B parameters: 669.2B x 1 B (fp8) + 1.9B x 2 B = "
            "626.82 GiB, held beside the idle KV") in text
    assert ("note: weights quantized (fp8: 8-bit weights, a 4 B scale per 128 x 128 "
            "block; 1 B a weight in all); its embeddings and output head (1.85B) at 2 B")\
        in text


def test_an_unquantized_model_is_sized_as_before(tmp_path: Path) -> None:
    plan = plan_for_config(tmp_path, LLAMA3_8B, "--sim-requests", "0")
    assert plan["model"]["weight_bytes"] == (EMBEDDINGS + LAYERS) * 2
    assert plan["model"]["quantization"] is None and plan["notes"] == []
    assert "8.0B parameters x 2 B = 14.96 GiB" in render(plan)


def test_an_unknown_method_is_counted_unquantized_with_a_note(tmp_path: Path) -> None:
    hqq = {"quant_method": "hqq", "quant_config": {"weight_quant_params": {"nbits": 4}}}
    plan = plan_for_config(tmp_path, {**LLAMA3_8B, "quantization_config": hqq},
                           "--sim-requests", "0")
    assert plan["model"]["weight_bytes"] == (EMBEDDINGS + LAYERS) * 2  # an upper bound
    (note,) = plan["notes"]
    assert note.startswith("config.json quantization_config.quant_method 'hqq' is not one "
                           "the plan reads (fp8, fbgemm_fp8, awq, gptq")
    assert note.endswith("its weights are counted unquantized, at 2 B a parameter, an "
                         "upper bound")
    assert f"note: {note}" in render(plan)


def test_without_vocab_size_the_embeddings_are_counted_quantized() -> None:
    no_vocab = {k: v for k, v in LLAMA3_8B.items() if k != "vocab_size"}
    sizing = sizing_from_config({**no_vocab, "num_parameters": 8_030_261_248,
                                 "quantization_config": COMPRESSED_FP8})
    assert sizing.weights.total_bytes == 8_030_261_248  # all of them at 1 B
    (note,) = sizing.notes
    assert "vocab_size absent: its embeddings and output head are counted quantized" in note


@pytest.mark.parametrize(("quant", "message"), [
    ({**AWQ, "bits": 32}, "config.json quantization_config.bits must be at most 16 bits, "
                          "got 32"),
    ({**GPTQ, "bits": "4"}, "config.json quantization_config.bits must be a positive "
                            "integer, got '4'"),
    ({**DEEPSEEK_FP8, "weight_block_size": [128]},
     "config.json quantization_config.weight_block_size must be two positive integers, "
     "got an array of 1"),
    ({**COMPRESSED_W4A16, "config_groups": None},
     "config.json quantization_config.config_groups must be an object of quantization "
     "schemes, got None"),
    ({**COMPRESSED_W4A16, "config_groups": {"group_0": {"weights": {"num_bits": 0}}}},
     "config.json quantization_config.config_groups.group_0.weights.num_bits must be a "
     "positive integer, got 0"),
    ("fp8", "config.json quantization_config must be an object, got 'fp8'"),
], ids=["bits-32", "bits-str", "block", "no-groups", "num-bits-0", "not-an-object"])
def test_a_bad_quantization_config_is_refused_naming_it(quant: object,
                                                        message: str) -> None:
    with pytest.raises(ValueError) as exc:
        sizing_from_config({**LLAMA3_8B, "quantization_config": quant})
    assert str(exc.value) == message


def test_an_older_compression_config_is_read_too() -> None:
    # older compressed-tensors checkpoints name it compression_config, as vLLM reads it
    sizing = sizing_from_config({**LLAMA3_8B, "compression_config": COMPRESSED_W4A16})
    assert sizing.weights.total_bytes == 5_700_059_136


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_huge_or_deep_value_is_named_briefly() -> None:
    # a deeply nested value (JSON allows it; repr overflows the stack near 1,000 levels)
    deep = {**DEEPSEEK_FP8, "weight_block_size": _nested(5_000)}
    with pytest.raises(ValueError) as exc:
        sizing_from_config({**LLAMA3_8B, "quantization_config": deep})
    assert str(exc.value).endswith("must be two positive integers, got an array of 1")
    # a huge unknown quant_method: its start, in the plan's note
    huge = sizing_from_config({**LLAMA3_8B, "quantization_config": {
        "quant_method": "q" * 100_000}})
    (note,) = huge.notes
    assert f"quant_method {'q' * 60!r}... is not one the plan reads" in note
    assert len(note) < 400


@pytest.mark.parametrize(("symmetric", "per_weight"), [
    # compressed-tensors' QuantizationArgs are symmetric unless they say not: a scale
    # per 128 alone, 0.5 + 2 / 128 = 0.515625 B
    (None, 0.515625),
    # asymmetric: a 16-bit scale and a 4-bit zero point per 128, 0.5 + 2.5 / 128
    (False, 0.51953125),
], ids=["absent", "false"])
def test_compressed_tensors_groups_are_symmetric_unless_they_say_not(
        symmetric: bool | None, per_weight: float) -> None:
    group = COMPRESSED_W4A16["config_groups"]["group_0"]
    weights = {k: v for k, v in group["weights"].items() if k != "symmetric"}
    if symmetric is not None:
        weights["symmetric"] = symmetric
    quant = {**COMPRESSED_W4A16, "config_groups": {"group_0": {**group,
                                                               "weights": weights}}}
    sizing = sizing_from_config({**LLAMA3_8B, "quantization_config": quant})
    assert sizing.weights.bytes_per_quantized == per_weight
    # AWQ without the key keeps its zero point (zero_point: true)
    awq = sizing_from_config({**LLAMA3_8B, "quantization_config": AWQ})
    assert awq.weights.bytes_per_quantized == 0.51953125
