"""A sim profile's model shape: counts are whole numbers, refused by name otherwise."""

from pathlib import Path

import pytest

from engine import cli
from engine.cost_model import PROFILE_DIR, load_profile


@pytest.mark.parametrize("line, bad", [
    ("num_layers: 32", "num_layers: 32.5"),
    ("num_heads: 32", "num_heads: 2.5"),
    ("dtype_bytes: 2", "dtype_bytes: 0.5"),
    ("max_model_len: 8192", "max_model_len: 8192.5"),
])
def test_a_profile_count_that_is_not_a_whole_number_is_refused_naming_it(
        tmp_path: Path, line: str, bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = (PROFILE_DIR / "llama3-8b-h100.yaml").read_text()
    assert line in text
    mine = tmp_path / "mine.yaml"
    mine.write_text(text.replace(line, bad))
    key, value = bad.split(": ")
    said = f"model.{key} must be a positive integer, got {value}"
    with pytest.raises(ValueError, match=said):
        load_profile(str(mine))
    # kvgate engine says so in one line: a float count was a TypeError traceback (or an
    # error naming the embedding width or the context length, not the profile's key)
    assert cli.main(["--profile", str(mine)]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
