"""The container files cannot be built here (no Docker engine); check what can be checked:
the compose file parses, every path it and the Dockerfiles name exists, the commands they
run parse with the real CLIs, and the gateway config lists exactly the engine services."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from engine import cli as engine_cli
from gateway.config import load_config
from kvgate.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILES = sorted(DEPLOY.rglob("Dockerfile*"))


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert isinstance(data, dict) and data["services"]
    return data


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    lines, pending = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        op, _, rest = line.partition(" ")
        lines.append((op.upper(), rest.strip()))
    return lines


def _exec_form(value: str) -> list[str]:
    return list(yaml.safe_load(value))  # JSON arrays are YAML


def test_compose_services_and_paths_exist() -> None:
    services = _compose()["services"]
    engines = [n for n in services if n.startswith("engine-")]
    assert len(engines) >= 2 and "gateway" in services
    for name, svc in services.items():
        build = svc["build"]
        context = (DEPLOY / build["context"]).resolve()
        assert context == ROOT, f"{name}: build context {context}"
        assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']}"
        for volume in svc.get("volumes", []):
            host = volume.split(":")[0]
            assert (DEPLOY / host).exists(), f"{name}: volume source {host} missing"
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"


def test_gateway_config_lists_the_engine_services(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "")  # compose passes it, empty by default
    monkeypatch.setenv("KVGATE_ENGINE_API_KEY", "")  # (the engines' key, likewise)
    services = _compose()["services"]
    mount = next(v for v in services["gateway"]["volumes"] if "gateway.yaml" in v)
    config = load_config(DEPLOY / mount.split(":")[0])
    hosts = {urlsplit(r.url).hostname for r in config.replicas}
    assert hosts == {n for n in services if n.startswith("engine-")}
    cmd = _exec_form(dict(_instructions(DEPLOY / "gateway" / "Dockerfile"))["CMD"])
    assert cmd[-1] == mount.split(":")[1]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_dockerfile_sources_exist_and_commands_parse(dockerfile: Path) -> None:
    ops = _instructions(dockerfile)
    assert ops[0][0] == "FROM"
    for op, rest in ops:
        if op == "COPY":
            *sources, _ = shlex.split(rest)
            for src in sources:
                assert (ROOT / src).exists(), f"{dockerfile.name}: COPY source {src} missing"
    names = [op for op, _ in ops]
    assert "HEALTHCHECK" in names and "USER" in names
    entry = _exec_form(dict(ops)["ENTRYPOINT"])
    cmd = _exec_form(dict(ops)["CMD"])
    assert entry[0] == "kvgate" and entry[1] in SUBCOMMANDS
    if entry[1] == "engine":
        parser = argparse.ArgumentParser()
        engine_cli.add_arguments(parser)
        args = parser.parse_args(cmd)
        assert args.host == "0.0.0.0"
        if "cuda" in dict(ops)["FROM"]:
            assert args.executor == "torch" and args.model == "/models/model"
            assert "VOLUME" in names and "[\"/models/model\"]" in dict(ops)["VOLUME"]
        else:
            assert args.executor == "sim"


def _installed_packages() -> set[str]:
    """The top-level packages ``pip install .`` installs: those of the repository that
    ``[tool.setuptools.packages.find]`` includes."""
    import fnmatch
    import tomllib

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]
    return {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()
            and any(fnmatch.fnmatch(p.name, pattern) for pattern in find["include"])}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_dockerfile_copies_every_package_it_installs(dockerfile: Path) -> None:
    copied = {src.strip("./").split("/")[0] for op, rest in _instructions(dockerfile)
              if op == "COPY" for src in shlex.split(rest)[:-1]}
    packages = _installed_packages()
    # the entry point (kvgate) is a package of its own: an image without it has no CLI
    assert {"kvgate", "gateway", "engine"} <= packages
    assert sorted(packages - copied) == [], f"{dockerfile.name} installs without them"
