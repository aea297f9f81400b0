"""One reader for the files the process is pointed at (``kvwire.regular_files``): a
secret file, a tokenizer's files and the engine's JSON configs are read only from a
regular file, within a bound told by the size before a byte is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.model.config import MAX_JSON_BYTES, ModelLoadError, read_json
from kvwire.regular_files import FileTooLarge, NotRegularFile, read_regular


def test_a_regular_file_is_read_and_anything_else_named(tmp_path: Path) -> None:
    text = tmp_path / "a.json"
    text.write_text('{"a": 1}')
    assert read_regular(text, 100) == b'{"a": 1}'
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile) as kind:
        read_regular(fifo, 100)  # opened without waiting for a writer
    assert kind.value.kind == "a FIFO"
    with pytest.raises(NotRegularFile) as device:
        read_regular("/dev/zero", 100)
    assert device.value.kind == "a character device"
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: its size tells, nothing is read
    with pytest.raises(FileTooLarge) as large:
        read_regular(big, 100)
    assert large.value.size == 1 << 30


def test_the_engines_json_configs_are_read_from_regular_files_only(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ModelLoadError, match="is a FIFO, not a regular file"):
        read_json(fifo)
    big = tmp_path / "model.safetensors.index.json"
    with open(big, "wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(ModelLoadError, match="JSON files are read up to"):
        read_json(big)
    good = tmp_path / "generation_config.json"
    good.write_text('{"eos_token_id": 2}')
    assert read_json(good) == {"eos_token_id": 2}
