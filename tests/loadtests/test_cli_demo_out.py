"""``kvgate demo --out``: a folder that cannot be made is named before the demo runs (its
results are written minutes later)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loadtests import cli_demo


def test_an_out_folder_that_cannot_be_made_is_refused_before_the_demo_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "demo"
    parser = argparse.ArgumentParser()
    cli_demo.add_arguments(parser)
    args = parser.parse_args(["--out", str(out), "--duration", "1", "--replicas", "1"])
    assert cli_demo.run(args) == 2
    assert capsys.readouterr().err == f"kvgate demo: --out {out}: Not a directory\n"
