"""``kvgate engine --model``: a directory that is not there is named as such, and a model
given to the sim executor (which would serve its profile's instead) is refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine import cli as engine_cli


def build(*argv: str) -> object:
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    return engine_cli.build_server(parser.parse_args(list(argv)))


def test_a_model_directory_that_is_not_there_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    with pytest.raises(ValueError, match=f"^--model {missing}: no such directory$"):
        build("--executor", "torch", "--model", str(missing))


def test_a_model_for_the_sim_executor_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--model is for the torch executor; add --executor "
                                         "torch"):
        build("--model", str(tmp_path))
