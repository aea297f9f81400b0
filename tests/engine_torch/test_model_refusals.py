"""A checkpoint the torch executor cannot compute exactly is refused when it is loaded, by
an error that names the config field and its value; one it can compute loads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine import cli
from engine.model import ModelConfig, ModelLoadError
from engine.model.loader import load_model
from engine.model.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", hidden_size=32,
                            heads=2, kv_heads=1, intermediate_size=32, layers=1)


def _config(tiny_dir: Path, **changes: Any) -> dict[str, Any]:
    return {**json.loads((tiny_dir / "config.json").read_text()), **changes}


def _with_config(tiny_dir: Path, out: Path, **changes: Any) -> Path:
    out.mkdir()
    (out / "model.safetensors").symlink_to(tiny_dir / "model.safetensors")
    (out / "config.json").write_text(json.dumps(_config(tiny_dir, **changes)))
    return out


MISTRAL = dict(architectures=["MistralForCausalLM"], model_type="mistral")
QWEN2 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2")


@pytest.mark.parametrize("changes, window", [
    (dict(MISTRAL, sliding_window=4096, max_position_embeddings=32768), 4096),
    (dict(MISTRAL, max_position_embeddings=32768), 4096),  # transformers' default window
    (dict(QWEN2, use_sliding_window=True, sliding_window=512, max_window_layers=0,
          max_position_embeddings=4096), 512),
    (dict(QWEN2, use_sliding_window=True, sliding_window=512, max_position_embeddings=4096,
          layer_types=["sliding_attention"]), 512),
])
def test_a_sliding_window_shorter_than_the_context_is_refused(
        tiny_dir: Path, changes: dict[str, Any], window: int) -> None:
    with pytest.raises(ModelLoadError, match=rf"sliding_window={window} is smaller than "
                                             r"max_position_embeddings=\d+: sliding-window"):
        ModelConfig.from_dict(_config(tiny_dir, **changes))


@pytest.mark.parametrize("changes", [
    dict(MISTRAL, sliding_window=4096, max_position_embeddings=4096),
    dict(MISTRAL, sliding_window=None, max_position_embeddings=32768),
    dict(QWEN2, use_sliding_window=False, sliding_window=512, max_position_embeddings=4096),
    # only layers from max_window_layers slide, and there are none
    dict(QWEN2, use_sliding_window=True, sliding_window=512, max_window_layers=28,
         max_position_embeddings=4096),
    dict(architectures=["LlamaForCausalLM"], sliding_window=16),  # Llama has none
])
def test_full_attention_configs_load(tiny_dir: Path, changes: dict[str, Any]) -> None:
    config = ModelConfig.from_dict(_config(tiny_dir, **changes))
    assert config.sliding_window is None or config.sliding_window >= \
        config.max_position_embeddings


def test_a_sliding_window_model_is_refused_at_load(tiny_dir: Path, tmp_path: Path) -> None:
    model_dir = _with_config(tiny_dir, tmp_path / "m", **MISTRAL, sliding_window=16,
                             max_position_embeddings=256)
    with pytest.raises(ModelLoadError, match="sliding_window=16 is smaller than "
                                             "max_position_embeddings=256"):
        load_model(model_dir)


@pytest.mark.parametrize("changes, said", [
    (dict(quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"}),
     "quantization_config (quant_method 'fp8') is not supported"),
    (dict(quantization_config={"quant_method": "gptq", "bits": 4}),
     "quantization_config (quant_method 'gptq') is not supported"),
    (dict(compression_config={"quant_method": "compressed-tensors"}),
     "compression_config (quant_method 'compressed-tensors') is not supported"),
])
def test_a_quantized_checkpoint_is_refused_at_load(
        tiny_dir: Path, tmp_path: Path, changes: dict[str, Any], said: str) -> None:
    # refused from its config, even where its tensors would pass for plain weights
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        load_model(_with_config(tiny_dir, tmp_path / "q", **changes))


@pytest.mark.parametrize("changes, said", [
    (dict(architectures=["MixtralForCausalLM"], num_local_experts=8),
     "unsupported architecture 'MixtralForCausalLM'"),
    (dict(architectures=None, model_type="qwen2_moe"), "unsupported architecture 'qwen2_moe'"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_type 'yarn'"),
    (dict(rope_scaling={"type": "longrope", "factor": 4.0}), "rope_type 'longrope'"),
    (dict(rope_scaling={"type": "su", "factor": 4.0}), "rope_type 'su'"),
    (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "rope_type 'dynamic'"),
    (dict(hidden_act="gelu_pytorch_tanh"), "hidden_act 'gelu_pytorch_tanh'"),
])
def test_other_math_is_refused_naming_its_value(
        tiny_dir: Path, changes: dict[str, Any], said: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        ModelConfig.from_dict(_config(tiny_dir, **changes))


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("changes, said", [
    (dict(rope_scaling={k: v for k, v in LLAMA3.items()
                        if k != "original_max_position_embeddings"}),
     "rope scaling 'llama3' lacks 'original_max_position_embeddings'"),
    (dict(rope_scaling={k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}),
     "rope scaling 'llama3' lacks 'low_freq_factor'"),
    (dict(rope_scaling={**LLAMA3, "high_freq_factor": 1.0}),
     "0 < low_freq_factor < high_freq_factor, got 1.0 and 1.0"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor 0.5 is not supported"),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                           "partial_rotary_factor": 0.25}),
     "partial_rotary_factor 0.25 is not supported"),
])
def test_rope_parameters_transformers_requires_are_required(
        tiny_dir: Path, changes: dict[str, Any], said: str) -> None:
    # a default put in their place would rotate by other frequencies than the model's
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        ModelConfig.from_dict(_config(tiny_dir, **changes))
    assert ModelConfig.from_dict(_config(tiny_dir, rope_scaling=LLAMA3)).rope.factor == 8


# a config.json value of the wrong type is refused naming its key and value, as every other
# config error is; none is truncated into a different model
@pytest.mark.parametrize("changes, said", [
    (dict(hidden_size=None), "hidden_size must be an integer, got None"),
    (dict(max_position_embeddings="4k"), "max_position_embeddings must be an integer, got '4k'"),
    (dict(num_attention_heads=2.5), "num_attention_heads must be an integer, got 2.5"),
    (dict(num_key_value_heads=True), "num_key_value_heads must be an integer, got True"),
    (dict(eos_token_id=[0, None]), "eos_token_id must be an integer, got None"),
    (dict(rope_theta="fast"), "rope_theta must be a finite number, got 'fast'"),
    (dict(rms_norm_eps=[1e-6]), "rms_norm_eps must be a finite number, got [1e-06]"),
    (dict(rope_theta=float("nan")), "rope_theta must be a finite number, got nan"),
    (dict(rope_scaling={**LLAMA3, "factor": "8x"}), "factor must be a finite number, got '8x'"),
    (dict(rope_scaling={**LLAMA3, "original_max_position_embeddings": 8192.5}),
     "original_max_position_embeddings must be an integer, got 8192.5"),
])
def test_a_value_of_the_wrong_type_is_refused_naming_its_key(
        tiny_dir: Path, changes: dict[str, Any], said: str) -> None:
    # before: a TypeError (None, a list), int()'s "invalid literal" naming no key, or a
    # head count of 2.5 read as 2
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        ModelConfig.from_dict(_config(tiny_dir, **changes))


def test_kvgate_engine_says_which_key_in_one_line(
        tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (model / name).symlink_to(tiny_dir / name)
    (model / "config.json").write_text(json.dumps(_config(tiny_dir, hidden_size=None)))
    assert cli.main(["--executor", "torch", "--model", str(model), "--device", "cpu",
                     "--kv-cache-gib", "0.001"]) == 2
    err = capsys.readouterr().err
    assert "hidden_size must be an integer, got None" in err and err.count("\n") == 1
