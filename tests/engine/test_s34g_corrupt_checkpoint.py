"""A safetensors file that cannot be read (cut short, a header length past the file, not a
file at all) is refused as a ModelLoadError naming the file, never a raw SafetensorError."""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.model import ModelLoadError
from engine.model.loader import load_model
from engine.model.tiny import write_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", hidden_size=32,
                            heads=2, kv_heads=1, intermediate_size=32, layers=1)


def _header(tensors: dict[str, object]) -> bytes:
    raw = json.dumps(tensors).encode()
    return struct.pack("<Q", len(raw)) + raw


def _cut_short(path: Path) -> None:  # the header names 4 KiB of data; 64 bytes follow
    path.write_bytes(_header({"model.norm.weight": {
        "dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}) + b"\0" * 64)


def _header_length_past_the_file(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")


def _header_not_json(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 8) + b"not json")


def _link_to_dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _pipe(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize("make, said", [
    (_cut_short, "is not a readable safetensors file"),
    (_header_length_past_the_file, "is not a readable safetensors file"),
    (_header_not_json, "is not a readable safetensors file"),
    (_link_to_dev_zero, "is not a regular file"),
    (_pipe, "is not a regular file"),
    (_directory, "is not a regular file"),
])
def test_an_unreadable_checkpoint_is_named(tiny_dir: Path, tmp_path: Path,
                                           make: Callable[[Path], None], said: str) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_bytes((tiny_dir / "config.json").read_bytes())
    make(model_dir / "model.safetensors")
    with pytest.raises(ModelLoadError,
                       match=re.escape(f"{model_dir / 'model.safetensors'} {said}")):
        load_model(model_dir)


def test_an_unreadable_shard_is_named_among_good_ones(tiny_dir: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_bytes((tiny_dir / "config.json").read_bytes())
    (model_dir / "model-1.safetensors").symlink_to(tiny_dir / "model.safetensors")
    _cut_short(model_dir / "model-2.safetensors")
    with pytest.raises(ModelLoadError, match=re.escape(
            f"{model_dir / 'model-2.safetensors'} is not a readable safetensors file")):
        load_model(model_dir)
