"""A model's end-of-sequence ids are those of its config.json and of its
generation_config.json together, as vLLM and transformers stop on both: an instruct
model whose config.json names the base model's end-of-text id and whose
generation_config.json adds the end-of-turn id stops at the end of its turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.core import EngineCore
from engine.model.config import ModelConfig, ModelLoadError
from engine.model.tiny import write_tiny_model
from engine.request import SamplingParams
from tests.support.torch_cores import torch_core

END_OF_TURN = 7  # an id the tiny model's config.json does not name


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = write_tiny_model(tmp_path_factory.mktemp("tiny"), "llama", seed=1)
    eos = json.loads((out / "config.json").read_text())["eos_token_id"]
    assert isinstance(eos, int) and eos != END_OF_TURN
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": None, "eos_token_id": [eos, END_OF_TURN]}))
    return out


def _run(core: EngineCore, **params: object) -> tuple[list[int], str | None]:
    # a large bias makes the end-of-turn id the greedy pick at every step
    core.add_request(core.make_request("r", [5, 17, 42, 99], SamplingParams(
        max_tokens=4, logit_bias=((END_OF_TURN, 100.0),), **params)))  # type: ignore[arg-type]
    tokens: list[int] = []
    reason = None
    while core.has_unfinished():
        for out in core.step().outputs:
            tokens.extend(out.new_token_ids)
            reason = out.finish_reason or reason
    return tokens, reason


def test_an_id_generation_config_names_ends_the_request(model_dir: Path) -> None:
    config = ModelConfig.from_file(model_dir / "config.json")
    first = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    assert config.eos_token_ids == (first, END_OF_TURN)  # config.json's first
    core = torch_core(model_dir)
    assert _run(core) == ([END_OF_TURN], "stop")
    assert _run(core, ignore_eos=True) == ([END_OF_TURN] * 4, "length")


@pytest.mark.parametrize("content", ['{"eos_token_id": "7"}', '{"eos_token_id": [1.5]}',
                                     "[7]", "{"])
def test_a_generation_config_that_is_no_config_is_refused_naming_it(
        model_dir: Path, tmp_path: Path, content: str) -> None:
    (tmp_path / "config.json").write_text((model_dir / "config.json").read_text())
    (tmp_path / "generation_config.json").write_text(content)
    with pytest.raises(ModelLoadError, match=r"generation_config\.json"):
        ModelConfig.from_file(tmp_path / "config.json")
