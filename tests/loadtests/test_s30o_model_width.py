"""A model's width (config.json's hidden_size) is kept in its shape where it is not
heads x head dim (MLA's heads attend over 192 values, Gemma's head_dim is its own): it is
the sim executor's default embedding width, which took 128 x 192 = 24576 for DeepSeek-V3."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine import cli
from engine.cost_model import load_profile
from engine.hf_shape import shape_from_config
from kvwire.tokenizer import load_tokenizer
from tests.support.model_configs import DEEPSEEK_V3, GEMMA3_27B, refused_shape


@pytest.mark.parametrize(("config", "width", "heads_by_dim"), [
    (DEEPSEEK_V3, 7168, 128 * 192), (GEMMA3_27B, 5376, 32 * 128),
], ids=["deepseek-v3", "gemma3-27b"])
def test_the_shape_keeps_the_models_width(config: dict[str, Any], width: int,
                                          heads_by_dim: int) -> None:
    shape = shape_from_config(config)
    assert shape.hidden_size == shape.model_dim == width
    assert shape.num_heads * shape.head_dim == heads_by_dim != width


def test_the_sim_executor_embeds_at_the_models_width(tmp_path: Path) -> None:
    # the profile kvgate plan writes for --model: the shape's fields as they are
    shape = shape_from_config(DEEPSEEK_V3)
    profile = tmp_path / "model.yaml"
    profile.write_text(yaml.safe_dump({"name": "v3", "model": asdict(shape), "gpu": asdict(
        load_profile("llama3-8b-h100").gpu)}))
    assert load_profile(str(profile)).model == shape
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    _, info = cli.make_executor(parser.parse_args(["--profile", str(profile)]),
                                load_tokenizer(None))
    assert info.embedding_dim == 7168


def test_a_profile_without_a_width_takes_heads_by_head_dim() -> None:
    model = load_profile("llama3-8b-h100").model
    assert (model.model_dim, model.hidden_size) == (None, 4096)


@pytest.mark.parametrize("width", [0, 7168.0, True])
def test_a_bad_width_is_refused_naming_it(width: object) -> None:
    assert refused_shape(model_dim=width) == \
        f"model.model_dim must be a positive integer, got {width!r}"
