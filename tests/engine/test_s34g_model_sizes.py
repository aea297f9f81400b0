"""A config.json whose sizes no model reaches is refused naming the key, before a module is
built or a weight allocated; one whose layer count is not its checkpoint's is refused
from the checkpoint's headers, before the model is built."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine.model import ModelConfig, ModelLoadError
from engine.model.loader import load_model
from engine.model.tiny import random_weights, tiny_config, write_tiny_model


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", hidden_size=32,
                            heads=2, kv_heads=1, intermediate_size=32, layers=1)


def _beside(model_dir: Path, out: Path, **changes: Any) -> Path:
    """``model_dir``'s checkpoint under a config.json with ``changes``."""
    out.mkdir()
    (out / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    config = {**json.loads((model_dir / "config.json").read_text()), **changes}
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("changes, said", [
    (dict(num_hidden_layers=10**6), "num_hidden_layers 1000000 is above 1,024"),
    (dict(num_hidden_layers=200_000), "num_hidden_layers 200000 is above 1,024"),
    (dict(vocab_size=10**12), "vocab_size 1000000000000 is above 4,194,304"),
    (dict(hidden_size=10**9, head_dim=16), "hidden_size 1000000000 is above 65,536"),
    (dict(intermediate_size=10**12), "intermediate_size 1000000000000 is above 262,144"),
    (dict(num_attention_heads=10**9, num_key_value_heads=10**9, head_dim=2),
     "num_attention_heads 1000000000 is above 1,024"),
    (dict(head_dim=1 << 20), "head_dim 1048576 is above 1,024"),
    (dict(max_position_embeddings=10**15),
     "max_position_embeddings 1000000000000000 is above 1,073,741,824"),
])
def test_a_size_past_every_model_is_refused_naming_it(changes: dict[str, Any],
                                                      said: str) -> None:
    config = {**tiny_config("llama", vocab_size=64, eos_token_id=0), **changes}
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        ModelConfig.from_dict(config)


def test_the_largest_llama_is_within_the_bounds() -> None:
    config = ModelConfig.from_dict({  # Llama 3.1 405B's config.json, in short
        "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 16384,
        "intermediate_size": 53248, "num_hidden_layers": 126, "num_attention_heads": 128,
        "num_key_value_heads": 8, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "eos_token_id": [128001, 128008, 128009]})
    assert (config.num_layers, config.hidden_size, config.head_dim) == (126, 16384, 128)


def test_random_weights_are_refused_before_a_layer_is_built() -> None:
    config = tiny_config("llama", vocab_size=64, eos_token_id=0, hidden_size=8, heads=2,
                         kv_heads=1, intermediate_size=8, layers=5000)
    with pytest.raises(ModelLoadError, match="num_hidden_layers 5000 is above 1,024"):
        random_weights(config, seed=0)


@pytest.mark.parametrize("layers, said", [
    (1000, "config.json num_hidden_layers 1000: the checkpoint holds layers 0..0"),
    (3, "config.json num_hidden_layers 3: the checkpoint holds layers 0..0"),
])
def test_more_layers_than_the_checkpoint_holds_are_refused_unbuilt(
        one_layer: Path, tmp_path: Path, layers: int, said: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        load_model(_beside(one_layer, tmp_path / "m", num_hidden_layers=layers))


def test_fewer_layers_than_the_checkpoint_holds_are_refused(tmp_path: Path) -> None:
    two = write_tiny_model(tmp_path / "two", "llama", hidden_size=16, heads=2, kv_heads=1,
                           intermediate_size=16, layers=2)
    said = "config.json num_hidden_layers 1: the checkpoint holds layers 0..1"
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        load_model(_beside(two, tmp_path / "m", num_hidden_layers=1))


def test_a_checkpoint_without_layers_is_named(one_layer: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_bytes((one_layer / "config.json").read_bytes())
    tensors = load_file(one_layer / "model.safetensors")
    save_file({n: t for n, t in tensors.items() if not n.startswith("model.layers.")},
              str(out / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"num_hidden_layers 1: the checkpoint holds "
                                             r"no layer tensor \(model\.layers\.N\.\*\)"):
        load_model(out)


def test_the_checkpoint_its_config_describes_loads(one_layer: Path) -> None:
    model = load_model(one_layer)
    assert len(model.model.layers) == 1
