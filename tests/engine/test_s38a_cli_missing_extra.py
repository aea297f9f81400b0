"""A kvgate subcommand whose optional dependency is not installed (``pip install
'kvgate[loadtest]'`` has no torch) names the extra that installs it, whatever arguments
follow, instead of argparse refusing the arguments of the parser it never built."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_BLOCKED = r"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from kvgate.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("args", [["/tmp/tiny"], ["/tmp/tiny", "--arch", "qwen2"], []])
def test_make_tiny_model_without_torch_names_the_engine_extra(args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-c", _BLOCKED, "make-tiny-model", *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stderr == ("kvgate make-tiny-model is unavailable (No module named 'torch'): "
                          "pip install 'kvgate[engine]'\n")


def test_each_extra_named_installs_the_module() -> None:
    from kvgate.cli import EXTRAS

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for module, extra in EXTRAS.items():
        assert any(r.replace("-", "_").startswith(module) for r in extras[extra]), (module, extra)


def test_unknown_arguments_of_an_installed_subcommand_are_still_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    from kvgate.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["audit", "x.jsonl", "--no-such-flag"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
