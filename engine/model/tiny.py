"""``kvgate make-tiny-model DIR [--arch llama|qwen2]``: a small random model for demos and
tests, written as a Hugging Face style directory (config.json, model.safetensors, and the
project tokenizer's tokenizer.json + tokenizer_config.json). Nothing is downloaded."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from kvwire.arg_types import positive_int

ARCHS = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}


def tiny_config(arch: str, *, vocab_size: int, eos_token_id: int | None, hidden_size: int = 64,
                layers: int = 2, heads: int = 4, kv_heads: int = 2,
                intermediate_size: int = 128, max_position: int = 4096) -> dict[str, Any]:
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
    architecture, model_type = ARCHS[arch]
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden_size // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_position,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0 if arch == "qwen2" else 500000.0,
        "tie_word_embeddings": arch == "qwen2",
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "torch_dtype": "float32",
    }


def random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Checkpoint tensors (tied head left out, as Hugging Face saves it)."""
    from engine.model.config import ModelConfig
    from engine.model.llama import CausalLM

    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_dict(config))
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, param in model.state_dict().items():
        if name == "lm_head.weight" and config["tie_word_embeddings"]:
            continue
        if "norm" in name:
            weights[name] = torch.ones(param.shape)
        else:
            weights[name] = torch.randn(param.shape, generator=gen) * 0.05
    return weights


def write_tiny_model(out_dir: str | Path, arch: str = "llama", seed: int = 0,
                     **sizes: int) -> Path:
    from safetensors.torch import save_file

    from kvwire.tokenizer_build import ASSET_DIR, EOS_TOKEN, build

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = ASSET_DIR / "tokenizer.json"
    if source.is_file():
        shutil.copyfile(source, out / "tokenizer.json")
    else:
        build(out)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    config = tiny_config(arch, vocab_size=tokenizer.get_vocab_size(),
                         eos_token_id=tokenizer.token_to_id(EOS_TOKEN), **sizes)
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS_TOKEN}, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(random_weights(config, seed), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, help="output directory (created if missing)")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden-size", type=positive_int, default=64)
    parser.add_argument("--layers", type=positive_int, default=2)
    parser.add_argument("--heads", type=positive_int, default=4)
    parser.add_argument("--kv-heads", type=positive_int, default=2)
    parser.add_argument("--intermediate-size", type=positive_int, default=128)
    parser.add_argument("--max-position", type=positive_int, default=4096)


MAX_PARAMS = 1 << 28  # 1 GiB of float32 weights: past that, no longer a tiny model


def parameter_count(hidden_size: int, layers: int, heads: int, kv_heads: int,
                    intermediate_size: int, vocab_size: int) -> int:
    """Weights of the model ``tiny_config`` describes (embedding and head counted apart,
    norms left out): per layer the q/o projections (hidden x hidden), k/v (hidden x
    kv_heads x head_dim) and the three MLP matrices (hidden x intermediate)."""
    kv_width = kv_heads * (hidden_size // heads)
    per_layer = 2 * hidden_size * hidden_size + 2 * hidden_size * kv_width \
        + 3 * hidden_size * intermediate_size
    return layers * per_layer + 2 * vocab_size * hidden_size


def run(args: argparse.Namespace) -> int:
    from kvwire.tokenizer_build import VOCAB_SIZE

    if args.hidden_size % args.heads or args.heads % args.kv_heads:
        print(f"kvgate make-tiny-model: --hidden-size {args.hidden_size} must divide by "
              f"--heads {args.heads} and --heads by --kv-heads {args.kv_heads}",
              file=sys.stderr)
        return 2
    params = parameter_count(args.hidden_size, args.layers, args.heads, args.kv_heads,
                             args.intermediate_size, VOCAB_SIZE)
    if params > MAX_PARAMS:
        print(f"kvgate make-tiny-model: --hidden-size {args.hidden_size}, --layers "
              f"{args.layers} and --intermediate-size {args.intermediate_size} make "
              f"{params:.3g} parameters; a tiny model has at most {MAX_PARAMS:,} (1 GiB "
              "of float32 weights)", file=sys.stderr)
        return 2
    out = write_tiny_model(args.dir, args.arch, args.seed, hidden_size=args.hidden_size,
                           layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                           intermediate_size=args.intermediate_size,
                           max_position=args.max_position)
    print(f"wrote a random {args.arch} model to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
