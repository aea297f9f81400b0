"""The torch executor's dtype from the checkpoint's and the device's facts: a GPU without
bfloat16 (compute capability below 8.0: T4, V100) computes a bfloat16 or float32
checkpoint in float16, as vLLM falls back, never in bfloat16 it cannot run."""

from __future__ import annotations

import pytest
import torch

from engine.model.config import ModelConfig, ModelLoadError
from engine.model.loader import choose_dtype, default_dtype
from tests.support.model_configs import LLAMA_MIN

T4, V100, A100, H100 = (7, 5), (7, 0), (8, 0), (9, 0)


@pytest.mark.parametrize(("checkpoint", "capability", "dtype"), [
    ("bfloat16", T4, torch.float16),
    ("bfloat16", V100, torch.float16),
    ("float32", V100, torch.float16),
    ("float16", V100, torch.float16),
    ("bfloat16", A100, torch.bfloat16),
    ("float32", H100, torch.bfloat16),
    ("float16", H100, torch.float16),
    ("bfloat16", None, torch.bfloat16),  # not a CUDA GPU: as before
])
def test_a_gpu_computes_in_a_dtype_it_has(checkpoint: str, capability: tuple[int, int] | None,
                                          dtype: torch.dtype) -> None:
    assert choose_dtype(checkpoint, "cuda", capability) == dtype


def test_the_cpu_computes_in_float32_whatever_the_checkpoint() -> None:
    assert choose_dtype("bfloat16", "cpu") == choose_dtype("float16", "cpu") == torch.float32
    config = ModelConfig.from_dict({**LLAMA_MIN, "torch_dtype": "bfloat16"})
    assert default_dtype(config, torch.device("cpu")) == torch.float32


def test_a_checkpoint_dtype_no_device_has_is_still_refused() -> None:
    with pytest.raises(ModelLoadError, match="'float8_e4m3fn' is not supported"):
        choose_dtype("float8_e4m3fn", "cuda", V100)
