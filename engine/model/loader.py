"""Load a model directory: ``config.json`` + one or more ``*.safetensors`` (+ the
``tokenizer.json`` the server needs). Errors name the file or tensor at fault."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import torch

from engine.model.config import ModelConfig, ModelLoadError, read_json, torch_dtype
from engine.model.llama import CausalLM
from engine.model.rope import inverse_frequencies

# tensors some checkpoints carry that this model recomputes or does not use
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The shards ``model.safetensors.index.json`` names, else every ``*.safetensors``.
    A shard is named by a path inside the directory (no ``..``, not absolute); the files
    themselves may be links elsewhere, as in a Hugging Face cache snapshot."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        raw = read_json(index)
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: 'weight_map' must be a non-empty object of "
                                 f"tensor name to shard file")
        for name in set(weight_map.values()):
            shard = PurePosixPath(name) if isinstance(name, str) else None
            if shard is None or not name or shard.is_absolute() or ".." in shard.parts \
                    or "\\" in name:
                raise ModelLoadError(f"{index} names shard {str(name)[:200]!r}, which is "
                                     f"not a file of {model_dir}")
        files = sorted({model_dir / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{index} names missing shard(s): {missing}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir}: no *.safetensors file found")
    return files


def check_model_dir(model_dir: str | Path, *, need_tokenizer: bool = True) -> Path:
    path = Path(model_dir)
    if not path.is_dir():
        raise ModelLoadError(f"model directory {path} not found")
    required = ["config.json"] + (["tokenizer.json"] if need_tokenizer else [])
    for name in required:
        if not (path / name).is_file():
            raise ModelLoadError(f"{path}: {name} not found")
    checkpoint_files(path)
    return path


# CUDA compute capability from which a GPU computes in bfloat16 (Ampere; not T4, V100)
BF16_MIN_CAPABILITY = (8, 0)


def choose_dtype(checkpoint_dtype: str, device_type: str,
                 capability: tuple[int, int] | None = None) -> torch.dtype:
    """The dtype to compute in, from the checkpoint's dtype and the device's facts
    (``capability``: a CUDA GPU's compute capability, ``None`` for another device):
    float32 on CPU, where half precision is slow; on a GPU the checkpoint's, a float32
    checkpoint's in bfloat16; float16 for bfloat16 on a GPU without it, as vLLM falls
    back."""
    if device_type == "cpu":
        return torch.float32
    dtype = torch_dtype(checkpoint_dtype) if checkpoint_dtype != "float32" else torch.bfloat16
    if dtype == torch.bfloat16 and capability is not None \
            and capability < BF16_MIN_CAPABILITY:
        return torch.float16
    return dtype


def default_dtype(config: ModelConfig, device: torch.device) -> torch.dtype:
    """``choose_dtype`` for ``config``'s checkpoint on ``device``."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return choose_dtype(config.dtype, device.type, capability)


class HeldTensor(NamedTuple):
    """A tensor the checkpoint holds, as its shard's header describes it."""

    file: Path
    shape: tuple[int, ...]


@contextmanager
def open_checkpoint(file: Path) -> Iterator[Any]:
    """``safe_open`` on ``file``; what it or a read through it raises (a device, pipe or
    directory instead of a file, a header cut short or longer than the file, data past
    the file's end) is a ``ModelLoadError`` naming the file."""
    from safetensors import SafetensorError, safe_open

    if not file.is_file():  # a FIFO would block the open; /dev/zero reads forever
        raise ModelLoadError(f"{file} is not a regular file")
    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            yield f
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(f"{file} is not a readable safetensors file: {exc}") from exc


def checkpoint_tensors(files: list[Path], config: ModelConfig) -> dict[str, HeldTensor]:
    """The tensors ``files`` hold, read from their headers alone (no tensor data), less
    those the model recomputes or ties; a tensor in two shards is refused."""
    held: dict[str, HeldTensor] = {}
    for file in files:
        with open_checkpoint(file) as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name.endswith(_IGNORED_SUFFIXES) or (
                        name == "lm_head.weight" and config.tie_word_embeddings):
                    continue
                if name in held:
                    raise ModelLoadError(f"{file.name}: tensor {name!r} is also in an "
                                         f"earlier shard")
                held[name] = HeldTensor(file, tuple(f.get_slice(name).get_shape()))
    return held


_LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.")


def _check_layers(config: ModelConfig, names: Iterable[str]) -> None:
    """Refuse a config whose ``num_hidden_layers`` is not the checkpoint's, before a
    module is built for each layer it names."""
    layers = sorted({int(m.group(1)) for name in names if (m := _LAYER_TENSOR.match(name))})
    if layers == list(range(config.num_layers)):
        return
    if not layers:
        holds = "no layer tensor (model.layers.N.*)"
    elif layers == list(range(len(layers))):
        holds = f"layers 0..{layers[-1]}"
    else:
        more = f" (+{len(layers) - 8} more)" if len(layers) > 8 else ""
        holds = f"layers {', '.join(map(str, layers[:8]))}{more}"
    raise ModelLoadError(f"config.json num_hidden_layers {config.num_layers}: the "
                         f"checkpoint holds {holds}")


def load_model(
    model_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> CausalLM:
    """The model in ``model_dir``, its checkpoint's headers checked against its config
    before the model is built, its tensors' shapes before their data is read."""
    path = check_model_dir(model_dir, need_tokenizer=False)
    device = torch.device(device)
    config = ModelConfig.from_file(path / "config.json")
    dtype = dtype or default_dtype(config, device)
    files = checkpoint_files(path)
    held = checkpoint_tensors(files, config)
    _check_layers(config, held)
    with torch.device("meta"):
        model = CausalLM(config, backend)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
    for name, (file, shape) in held.items():
        if name not in expected:
            raise ModelLoadError(f"{file.name}: unexpected tensor {name!r} for "
                                 f"{config.architecture}")
        if shape != expected[name]:
            raise ModelLoadError(f"{file.name}: tensor {name!r} has shape {shape}, "
                                 f"config.json implies {expected[name]}")
    missing = sorted(set(expected) - set(held))
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(f"{path}: checkpoint lacks tensor(s) {missing[:5]}{more}")
    by_file: dict[Path, list[str]] = {file: [] for file in files}
    for name, tensor in held.items():
        by_file[tensor.file].append(name)
    state: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        with open_checkpoint(file) as f:
            for name in names:
                state[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.inv_freq = inverse_frequencies(config.rope, config.head_dim).to(device)
    return model.eval()
