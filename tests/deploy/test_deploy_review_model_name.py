"""The model name clients of the Kubernetes bundle ask for, as docs/deploy.md gives it, is
the one its engines serve: ``--model-name``, else the name of the ``--model`` directory
(engine.cli), which every other name is answered with a 404 ``model_not_found``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path, PurePosixPath

import yaml

from engine import cli as engine_cli

ROOT = Path(__file__).resolve().parents[2]


def served_model_name() -> str:
    manifest = yaml.safe_load((ROOT / "deploy" / "k8s" / "engine-deployment.yaml").read_text())
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    parser = argparse.ArgumentParser()
    engine_cli.add_arguments(parser)
    args = parser.parse_args(container["args"])
    assert args.executor == "torch" and args.model
    return str(args.model_name or PurePosixPath(args.model).name)


def test_docs_give_clients_the_served_model_name() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    asked = set(re.findall(r'"model":\s*"([^"]*)"', doc))
    assert asked == {served_model_name()}, \
        f"docs/deploy.md asks for {sorted(asked)}; the engines serve {served_model_name()!r}"
