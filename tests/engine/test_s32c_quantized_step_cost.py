"""A quantized model's simulated steps read its weights at the bytes its checkpoint stores
them in, the same figure kvgate plan prints as the weights' memory (``ModelShape.weights``),
not at the activation dtype's: decode, bound by reading the weights, is timed faster."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engine.cost_model import CostModel, load_profile
from engine.hf_shape import sizing_from_config, sizing_from_dir
from loadtests import plan as plan_cli
from tests.support.model_configs import LLAMA3_8B, MIXTRAL_8X7B, refused_shape
from tests.support.plan_runs import plan_for_config, plan_parser

# hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4's: 4 bits, a scale and zero point
# per 128 weights
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
       "zero_point": True}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
GPU = load_profile("llama3-8b-h100").gpu
BYTES_RATE = GPU.hbm_tb_per_s * 1e12 * GPU.bandwidth_efficiency


def _decode_seconds(config: dict[str, Any], context: int = 1000) -> float:
    return CostModel(sizing_from_config(config).shape, GPU).step_seconds([(context, 1)])


def test_a_quantized_dense_models_decode_reads_its_stored_weights() -> None:
    sizing = sizing_from_config({**LLAMA3_8B, "quantization_config": AWQ})
    shape = sizing.shape
    assert shape.weights == sizing.weights  # one figure: the plan's and the roofline's
    # 6,979,321,856 x 0.51953125 B + the embeddings and head's 1,050,673,152 x 2 B
    assert shape.weight_bytes_read(1) == sizing.weights.total_bytes == 5_727_322_112
    kv = shape.kv_bytes_per_token * (1000 + 2)
    step = CostModel(shape, GPU).step_seconds([(1000, 1)])
    assert step == pytest.approx((5_727_322_112 + kv) / BYTES_RATE
                                 + GPU.step_overhead_ms / 1e3, rel=1e-12)
    # at bfloat16 the same decode reads 16,059,990,016 B of weights
    assert _decode_seconds(LLAMA3_8B) - step == pytest.approx(
        (16_059_990_016 - 5_727_322_112) / BYTES_RATE, rel=1e-9)


def test_a_quantized_mixture_of_experts_skips_quantized_experts() -> None:
    shape = sizing_from_config({**MIXTRAL_8X7B, "quantization_config": FP8}).shape
    total = shape.weights.total_bytes
    unused = shape.params - shape.active  # a lone token's 6 of 8 experts, 1 B each
    assert shape.weight_bytes_read(1) == pytest.approx(total - unused, rel=1e-12)
    assert shape.weight_bytes_read(4096) == pytest.approx(total, rel=1e-9)
    plain = sizing_from_config(MIXTRAL_8X7B).shape
    # the quantized weights a lone token reads, at 1 B rather than 2
    assert plain.weight_bytes_read(1) - shape.weight_bytes_read(1) == pytest.approx(
        shape.quantized_params - unused, rel=1e-9)


@pytest.mark.parametrize("quantized", [1e9, 30e9])
def test_experts_past_the_quantized_weights_are_skipped_at_the_dtype(
        quantized: float) -> None:
    """Fewer quantized weights than the routed experts a lone token leaves unread: those
    unread past them are at the dtype's bytes, and a step never reads fewer bytes than
    its token's own weights."""
    plain = sizing_from_config(MIXTRAL_8X7B).shape
    shape = dataclasses.replace(plain, quantized_params=quantized,
                                bytes_per_quantized_param=4.0, quantization="test")
    unused = shape.params - shape.active
    assert unused > quantized
    # every quantized weight unread (4 B each), and unused - quantized at 2 B
    assert shape.weight_bytes_read(1) == pytest.approx(
        shape.weights.total_bytes - quantized * 4 - (unused - quantized) * 2, rel=1e-12)
    assert shape.weight_bytes_read(1) == pytest.approx(shape.active * 2, rel=1e-12)
    assert shape.weight_bytes_read(4096) == pytest.approx(shape.weights.total_bytes,
                                                          rel=1e-9)
    for tokens in (1, 2, 8, 64):
        assert 0 < plain.weight_bytes_read(tokens) <= shape.weight_bytes_read(tokens)


def test_the_plans_simulator_gets_the_quantized_weights(tmp_path: Path) -> None:
    config = {**LLAMA3_8B, "quantization_config": AWQ}
    plan = plan_for_config(tmp_path, config, "--sim-requests", "0")
    # the profile build_plan writes for --model, on its default --gpu-profile
    gpu_profile = plan_parser().parse_args(["--model", str(tmp_path)]).gpu_profile
    profile, _ = plan_cli.model_profile(str(tmp_path), gpu_profile, tmp_path)
    simulated = load_profile(profile).model
    assert simulated == sizing_from_dir(tmp_path).shape
    assert simulated.weight_bytes_read(1) == plan["model"]["weight_bytes"] == 5_727_322_112
    assert plan["model"]["quantization"] == "awq"


def test_unquantized_weights_are_read_at_the_dtype() -> None:
    shape = sizing_from_config(LLAMA3_8B).shape
    assert (shape.quantized_params, shape.quantization) == (0.0, None)
    assert shape.weight_bytes_read(7) == shape.params * 2


@pytest.mark.parametrize(("changes", "message"), [
    ({"quantized_params": 9e9}, "model.quantized_params must be a number in [0, params=8e+09]"
                                ", got 9000000000.0"),
    ({"quantized_params": 7e9}, "model.bytes_per_quantized_param must be a number in (0, 8] "
                                "with 7e+09 quantized_params, got 0.0"),
    ({"quantized_params": 7e9, "bytes_per_quantized_param": float("nan")},
     "model.bytes_per_quantized_param must be a number in (0, 8] with 7e+09 "
     "quantized_params, got nan"),
    ({"quantization": 4}, "model.quantization must be a string or null, got 4"),
])
def test_bad_quantization_settings_are_refused_naming_them(changes: dict[str, Any],
                                                           message: str) -> None:
    assert refused_shape(**changes) == message
