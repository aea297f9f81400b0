"""An end-of-sequence id outside the model's vocabulary (in config.json or in the
generation_config.json beside it) is refused naming the file, the key and the id: the
model could never sample it, so a sequence would never stop on it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from engine.model import ModelConfig, ModelLoadError
from engine.model.tiny import tiny_config

VOCAB = 64


def _config(eos: Any) -> dict[str, Any]:
    return tiny_config("llama", vocab_size=VOCAB, eos_token_id=eos)


@pytest.mark.parametrize("eos, bad", [
    (10**12, 10**12), (-5, -5), (VOCAB, VOCAB), ([3, 10**12], 10**12), ([-1, 3], -1),
])
def test_an_eos_id_outside_the_vocabulary_is_refused(eos: Any, bad: int) -> None:
    said = f"config.json eos_token_id {bad} is outside the vocabulary: ids run from 0 to 63"
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        ModelConfig.from_dict(_config(eos))


@pytest.mark.parametrize("eos, ids", [(0, (0,)), (VOCAB - 1, (63,)), ([1, 2], (1, 2)),
                                      (None, ())])
def test_eos_ids_inside_the_vocabulary_are_kept(eos: Any, ids: tuple[int, ...]) -> None:
    assert ModelConfig.from_dict(_config(eos)).eos_token_ids == ids


def test_a_generation_config_eos_id_outside_the_vocabulary_is_refused(tmp_path: Path
                                                                      ) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_config(0)))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 70]}))
    said = "generation_config.json eos_token_id 70 is outside the vocabulary"
    with pytest.raises(ModelLoadError, match=re.escape(said)):
        ModelConfig.from_file(tmp_path / "config.json")
