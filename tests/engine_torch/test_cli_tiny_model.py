"""``kvgate make-tiny-model`` (and any kvgate command) into a folder that cannot be made:
one line naming it and exit 1, not a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvgate.cli import main


def test_a_model_folder_that_cannot_be_made_is_named_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "tiny"
    argv = list(sys.argv)
    assert main(["make-tiny-model", str(out)]) == 1
    assert sys.argv == argv  # the caller's, untouched
    assert capsys.readouterr().err == f"kvgate make-tiny-model: Not a directory: {out}\n"
