"""``kvgate plan`` run in process, as the tests of its sizing run it: its own parser and
``build_plan``, for a ``config.json`` written to a test's folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from loadtests import plan as plan_cli


def plan_parser() -> argparse.ArgumentParser:
    """``kvgate plan``'s argument parser."""
    parser = argparse.ArgumentParser(prog="kvgate plan")
    plan_cli.add_arguments(parser)
    return parser


def plan_for_config(tmp_path: Path, config: dict[str, Any], *flags: str) -> dict[str, Any]:
    """The plan for ``config`` (written to ``tmp_path/config.json``) with ``--model
    tmp_path`` and ``flags``."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    return plan_cli.build_plan(plan_parser().parse_args(["--model", str(tmp_path), *flags]))
