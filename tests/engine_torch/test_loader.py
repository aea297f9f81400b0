"""Model directories: the tiny-model writer, transformers reading what it writes, and the
loader's errors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from engine import cli
from engine.executor import SeqWork
from engine.executors.torch_executor import TorchExecutor
from engine.model import ModelConfig, ModelLoadError, kv_bytes_per_token
from engine.model.loader import check_model_dir, load_model
from engine.model.tiny import add_arguments, run, write_tiny_model
from kvwire.tokenizer import load_tokenizer


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_matches_transformers(arch: str, tmp_path: Path) -> None:
    import transformers

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args([str(tmp_path), "--arch", arch, "--seed", "3"])) == 0
    check_model_dir(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["vocab_size"] == 4096 and config["eos_token_id"] == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ex = TorchExecutor.from_dir(tmp_path, num_blocks=8, block_size=16, device="cpu")
    ids = list(range(100, 140))
    ours = ex.last_logits([SeqWork("a", ids, 0, [3, 1, 6], True)], all_positions=True)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    assert ex.eos_token_id == 0


@pytest.mark.parametrize("argv, said", [
    (["--heads", "0"], "argument --heads: must be >= 1, got 0"),
    (["--layers", "-2"], "argument --layers: must be >= 1, got -2"),
    (["--kv-heads", "0"], "argument --kv-heads: must be >= 1, got 0"),
    (["--hidden-size", "0"], "argument --hidden-size: must be >= 1, got 0"),
])
def test_make_tiny_model_refuses_a_size_of_nothing(
        argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvgate make-tiny-model")
    add_arguments(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([str(tmp_path / "m"), *argv])
    assert exited.value.code == 2 and said in capsys.readouterr().err


def test_make_tiny_model_refuses_a_model_that_is_not_tiny(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    out = tmp_path / "m"
    big = ["--hidden-size", "8192", "--heads", "64", "--kv-heads", "8", "--layers", "64"]
    assert run(parser.parse_args([str(out), *big])) == 2
    assert "9.93e+09 parameters; a tiny model has at most" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "qwen2")


def _copy(src: Path, dst: Path, **config_changes: object) -> Path:
    dst.mkdir(exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    config = json.loads((src / "config.json").read_text())
    config.update(config_changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_missing_files(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(tmp_path / "nope")
    d = _copy(tiny_dir, tmp_path / "m")
    (d / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json not found"):
        check_model_dir(d)
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load_model(d)
    (d / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json not found"):
        load_model(d)


def test_unsupported_architecture_and_options(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy(tiny_dir, tmp_path / "a", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ModelLoadError, match="unsupported architecture 'GPT2LMHeadModel'"):
        load_model(d)
    with pytest.raises(ModelLoadError, match="rope_type 'yarn'"):
        ModelConfig.from_dict({**json.loads((tiny_dir / "config.json").read_text()),
                               "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ModelLoadError, match="hidden_act 'gelu'"):
        ModelConfig.from_dict({**json.loads((tiny_dir / "config.json").read_text()),
                               "hidden_act": "gelu"})


def test_shape_mismatch_names_the_tensor(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy(tiny_dir, tmp_path / "s", intermediate_size=96)
    with pytest.raises(ModelLoadError, match=r"'model\.layers\.0\.mlp\.(gate|up|down)_proj"
                                             r"\.weight' has shape"):
        load_model(d)


def test_missing_tensor_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = _copy(tiny_dir, tmp_path / "t")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"lacks tensor\(s\) "
                                             r"\['model\.layers\.1\.mlp\.up_proj\.weight'\]"):
        load_model(d)


def test_kv_bytes_per_token(tiny_dir: Path) -> None:
    config = ModelConfig.from_file(tiny_dir / "config.json")
    # K and V x 2 layers x 2 KV heads x head_dim 16 x 4 bytes
    assert kv_bytes_per_token(config, torch.float32) == 2 * 2 * 2 * 16 * 4
    assert kv_bytes_per_token(config, torch.bfloat16) == 2 * 2 * 2 * 16 * 2


def test_config_layouts_and_rope_variants() -> None:
    from engine.model.rope import inverse_frequencies

    base = {"architectures": ["MistralForCausalLM"], "vocab_size": 10, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "rope_theta": 1000.0}
    plain = ModelConfig.from_dict(base)
    assert plain.head_dim == 8 and plain.flavour == "llama" and not plain.qkv_bias
    linear = ModelConfig.from_dict({**base, "rope_scaling": {"type": "linear", "factor": 2.0}})
    torch.testing.assert_close(inverse_frequencies(linear.rope, 8),
                               inverse_frequencies(plain.rope, 8) / 2)
    newer = ModelConfig.from_dict({**base, "rope_parameters": {"rope_type": "default",
                                                               "rope_theta": 1000.0}})
    assert newer.rope == plain.rope
    qwen = ModelConfig.from_dict({**base, "architectures": ["Qwen2ForCausalLM"],
                                  "sliding_window": 4096, "use_sliding_window": False,
                                  "eos_token_id": [7, 8]})
    assert qwen.qkv_bias and not qwen.o_bias and qwen.sliding_window is None
    assert qwen.eos_token_ids == (7, 8)
    with pytest.raises(ModelLoadError, match="not a multiple"):
        ModelConfig.from_dict({**base, "num_key_value_heads": 3})
    with pytest.raises(ModelLoadError, match="lacks 'hidden_size'"):
        ModelConfig.from_dict({k: v for k, v in base.items() if k != "hidden_size"})


def test_a_context_past_the_models_positions_is_refused_at_start(tmp_path: Path) -> None:
    model_dir = write_tiny_model(tmp_path, "llama", max_position=256)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--executor", "torch", "--model", str(model_dir), "--device", "cpu",
            "--kv-cache-gib", "0.001", "--max-model-len"]
    with pytest.raises(ValueError, match=r"max-model-len 257 .*max_position_embeddings=256"):
        cli.make_executor(parser.parse_args([*argv, "257"]), load_tokenizer(model_dir))
    _, info = cli.make_executor(parser.parse_args([*argv, "256"]), load_tokenizer(model_dir))
    assert info.max_model_len == 256
