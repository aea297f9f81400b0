"""Checkpoints in shards: ``model.safetensors.index.json`` names files of the model
directory only, every shard it names must be there, a tensor comes from one shard, and a
config or index too large to be one is refused before it is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model import ModelLoadError
from engine.model.loader import load_model
from engine.model.tiny import write_tiny_model

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", hidden_size=32,
                            heads=2, kv_heads=1, intermediate_size=32, layers=1)


def _sharded(tiny_dir: Path, out: Path, shard_names: tuple[str, str] = (
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"),
             write: bool = True) -> Path:
    """The tiny model with its tensors split over two shards and an index naming them."""
    out.mkdir(exist_ok=True)
    (out / "config.json").write_bytes((tiny_dir / "config.json").read_bytes())
    tensors = load_file(tiny_dir / "model.safetensors")
    names = sorted(tensors)
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for shard, part in zip(shard_names, halves, strict=True):
        if write:
            (out / shard).parent.mkdir(parents=True, exist_ok=True)
            save_file({n: tensors[n] for n in part}, str(out / shard))
        weight_map |= dict.fromkeys(part, shard)
    (out / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def test_shards_load_as_the_single_file(tiny_dir: Path, tmp_path: Path) -> None:
    whole = load_model(tiny_dir).state_dict()
    sharded = load_model(_sharded(tiny_dir, tmp_path / "m")).state_dict()
    assert sorted(sharded) == sorted(whole)
    for name, tensor in whole.items():
        assert torch.equal(sharded[name], tensor), name


@pytest.mark.parametrize("outside", ["../elsewhere/model-2.safetensors",
                                     "sub/../../model-2.safetensors", "ABSOLUTE"])
def test_a_shard_outside_the_directory_is_refused(tiny_dir: Path, tmp_path: Path,
                                                  outside: str) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    if outside == "ABSOLUTE":
        outside = str(tmp_path / "elsewhere" / "model-2.safetensors")
    # the outside file exists (a valid shard): only where it lies is wrong
    _sharded(tiny_dir, tmp_path / "m", ("model-1.safetensors", outside))
    with pytest.raises(ModelLoadError, match=r"names shard '.*model-2\.safetensors', which "
                                             r"is not a file of"):
        load_model(model_dir)


def test_a_link_to_a_shard_elsewhere_loads(tiny_dir: Path, tmp_path: Path) -> None:
    # a Hugging Face cache snapshot: the directory's files link to blobs elsewhere
    store = _sharded(tiny_dir, tmp_path / "blobs")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for f in store.iterdir():
        (snapshot / f.name).symlink_to(f)
    assert len(load_model(snapshot).state_dict()) == len(load_model(store).state_dict())


def test_a_missing_shard_or_a_broken_index_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    model_dir = _sharded(tiny_dir, tmp_path / "m")
    (model_dir / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"names missing shard\(s\): \[.*model-00002"):
        load_model(model_dir)
    (model_dir / INDEX).write_text('{"weight_map": ')
    with pytest.raises(ModelLoadError, match=r"index\.json is not valid JSON"):
        load_model(model_dir)
    (model_dir / INDEX).write_text('{"weight_map": ["model-00001-of-00002.safetensors"]}')
    with pytest.raises(ModelLoadError, match="'weight_map' must be a non-empty object"):
        load_model(model_dir)


def test_a_tensor_in_two_shards_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    model_dir = _sharded(tiny_dir, tmp_path / "m")
    first = model_dir / "model-00001-of-00002.safetensors"
    tensors = load_file(first)
    name = sorted(tensors)[0]
    save_file({name: torch.zeros_like(tensors[name])},
              str(model_dir / "model-00003.safetensors"))
    index = json.loads((model_dir / INDEX).read_text())
    index["weight_map"]["extra"] = "model-00003.safetensors"
    (model_dir / INDEX).write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=rf"tensor '{name}' is also in an earlier shard"):
        load_model(model_dir)


def test_a_config_too_large_to_be_one_is_refused_unread(tiny_dir: Path, tmp_path: Path
                                                        ) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "model.safetensors").symlink_to(tiny_dir / "model.safetensors")
    with open(model_dir / "config.json", "wb") as f:  # sparse: takes no disk
        f.truncate(1 << 40)
    with pytest.raises(ModelLoadError, match=r"config\.json is 1099511627776 bytes"):
        load_model(model_dir)
    (model_dir / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="must hold a JSON object, got list"):
        load_model(model_dir)
