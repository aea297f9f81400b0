"""A config.json value of the wrong type is refused by an error naming its key and value,
as every other config error is; none is truncated into a different model."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine import cli
from engine.model import ModelConfig, ModelLoadError
from engine.model.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", hidden_size=32,
                            heads=2, kv_heads=1, intermediate_size=32, layers=1)


def _config(tiny_dir: Path, **changes: Any) -> dict[str, Any]:
    return {**json.loads((tiny_dir / "config.json").read_text()), **changes}


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


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
