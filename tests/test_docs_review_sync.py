"""The user-facing docs against the code: what an operator copies from README.md and
docs/*.md (config YAML, config keys, metric names, commands) is read by the real parsers
and looked up in the real sources, so a renamed key, metric or flag fails here instead of
in someone's deployment."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import shlex
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import GatewayConfig, parse_config
from kvgate.cli import build_parser
from policies.config import ConfigError, from_mapping
from policies.registry import build_policy

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SECTIONS = {f.name: f for f in dataclasses.fields(GatewayConfig)}
HINTS = typing.get_type_hints(GatewayConfig)
A_REPLICA = {"id": "r0", "url": "http://127.0.0.1:8101"}
PROJECT_MODULES = ("gateway", "policies", "engine", "kvwire", "loadtests", "kvgate")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _prose(path: Path) -> str:
    """The doc without its fenced blocks, lines joined (inline code may wrap)."""
    return re.sub(r"\s*\n\s*", " ", re.sub(r"```.*?```", "", _text(path), flags=re.S))


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _text(path), flags=re.S)


def _secret_envs(data: Any) -> Iterator[str]:
    """The environment variables a config names for its secrets (``*_env`` keys)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key.endswith("_env") and isinstance(value, str):
                yield value
            yield from _secret_envs(value)
    elif isinstance(data, list):
        for item in data:
            yield from _secret_envs(item)


def _set_secrets(monkeypatch: pytest.MonkeyPatch, data: Any) -> None:
    for name in _secret_envs(data):
        monkeypatch.setenv(name, "s3cr3t-" + "k" * 40)  # long enough for every secret


def _yaml_examples() -> list[Any]:
    return [pytest.param(block, id=f"{path.name}#{i}")
            for path in DOCS for i, block in enumerate(_blocks(path, "yaml"))]


@pytest.mark.parametrize("block", _yaml_examples())
def test_every_yaml_example_is_a_config_the_gateway_loads(
        block: str, monkeypatch: pytest.MonkeyPatch) -> None:
    data = yaml.safe_load(block)
    assert isinstance(data, dict) and set(data) <= set(SECTIONS), data
    _set_secrets(monkeypatch, data)
    config = parse_config({"replicas": [A_REPLICA], **data}, where="example")
    build_policy(config.policy)


def _section_parser(section: str) -> Any:
    """What reads one top-level section's value: a dataclass, or a list of them."""
    hint = HINTS[section]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    cls: Any = args[0]
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return None
    if typing.get_origin(hint) is list:
        return lambda value, where: [from_mapping(cls, v, f"{where}[{i}]")
                                     for i, v in enumerate(value)]
    return lambda value, where: from_mapping(cls, value, where)


def inline_config_errors(prose: str) -> list[str]:
    """Inline ``section: {...}`` snippets of a doc's prose that its section's parser
    refuses (each snippet alone: cross-section rules need a whole config)."""
    errors = []
    for match in re.finditer(r"`([a-z_]+): (\{[^`]*\})`", prose):
        section, snippet = match.group(1), match.group(0).strip("`")
        parse = _section_parser(section) if section in SECTIONS else None
        if parse is None:
            continue
        value = yaml.safe_load(snippet)[section]
        try:
            parse(value, section)
        except ConfigError as exc:
            errors.append(f"{snippet}: {exc}")
    return errors


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_inline_config_snippet_parses(path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    prose = _prose(path)
    for match in re.finditer(r"`([a-z_]+): (\{[^`]*\})`", prose):
        _set_secrets(monkeypatch, yaml.safe_load(match.group(0).strip("`")))
    assert inline_config_errors(prose) == []


def _resolves(dotted: str) -> bool:
    cls: Any = GatewayConfig
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        cls = hints[part]
        args = [a for a in typing.get_args(cls) if a is not type(None)]
        if typing.get_origin(cls) in (typing.Union, type(int | None)) and len(args) == 1:
            cls = args[0]
    return True


def unknown_config_keys(prose: str) -> list[str]:
    """``section.key`` names in a doc's prose that are no key of the gateway's config (a
    file's name, ``tokenizer.json``, is none)."""
    named = re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", prose)
    return sorted({n for n in named if n.split(".")[0] in SECTIONS and not _resolves(n)
                   and not n.endswith((".json", ".jinja", ".yaml"))})


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_dotted_config_key_exists(path: Path) -> None:
    assert unknown_config_keys(_prose(path)) == []


def _source_literals() -> set[str]:
    found: set[str] = set()
    for package in ("gateway", "engine", "kvwire"):
        for source in (ROOT / package).rglob("*.py"):
            found.update(re.findall(r"[\"']([a-z0-9_:]+)[\"']", _text(source)))
    return found


def _expanded(name: str) -> list[str]:
    """``vllm:request_{queue,prefill}_time_seconds`` as the names it stands for."""
    match = re.search(r"\{([a-z_,]+)\}", name)
    if match is None:
        return [name]
    return [n for part in match.group(1).split(",")
            for n in _expanded(name[:match.start()] + part + name[match.end():])]


def unknown_metrics(prose: str, literals: set[str]) -> list[str]:
    """Metric names (``kvgate_*``, ``vllm:*``, ``sglang:*``, ``kvgate:*``) a doc's prose
    names that no source of the gateway, the engine or kvwire defines."""
    from loadtests.third_party import KINDS  # router:policy names look alike

    policies = {f"{kind.name}:{policy}" for kind in KINDS.values() for policy in kind.policies}
    unknown = set()
    # a name, its {a,b} alternatives inside it; its {labels} and a family's * left out
    for raw, family in re.findall(
            r"`((?:kvgate_|kvgate:|vllm:|sglang:)[a-z0-9_]+(?:\{[a-z_,]+\}[a-z0-9_]+)*)(\*?)",
            prose):
        for name in _expanded(raw):
            base = re.sub(r"_(total|bucket|sum|count)$", "", name)
            if family:
                known = any(literal.startswith(name) for literal in literals)
            else:
                known = name in policies or bool({name, base} & literals)
            if not known:
                unknown.add(name + family)
    return sorted(unknown)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_metric_named_is_defined(path: Path) -> None:
    assert unknown_metrics(_prose(path), _source_literals()) == []


def _commands(block: str) -> Iterator[tuple[str, list[str]]]:
    """(program, argv) of each ``kvgate ...`` or ``python -m <project module> ...`` in a
    shell block; ``[--opt x]`` counts as written."""
    for line in block.replace("\\\n", " ").splitlines():
        for part in re.split(r"&&|'", line.split(" # ")[0]):
            match = re.search(r"(?:^|\s)(?:python -m (\S+)|kvgate) (.*)", part)
            if match is None:
                continue
            argv = shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", match.group(2)))
            module = match.group(1)
            if module is None:
                yield "kvgate", argv
            elif module.split(".")[0] in PROJECT_MODULES:
                yield module, argv


def command_error(program: str, argv: list[str]) -> str | None:
    """Why the real parser refuses ``argv`` (None: it takes it); nothing is run."""
    if program == "kvgate":
        parser, _ = build_parser(argv)
    else:
        module = importlib.import_module(program)
        if not hasattr(module, "add_arguments"):
            return None  # its parser is built inside main(), which would run it
        parser = argparse.ArgumentParser(prog=program)
        module.add_arguments(parser)
    parser.exit_on_error = False
    try:
        parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        return f"{program} {shlex.join(argv)}: {exc}"
    return None


def _shell_commands() -> list[Any]:
    return [pytest.param(program, argv, id=f"{path.name}:{program}:{argv[:1]}")
            for path in DOCS for block in _blocks(path, "bash")
            for program, argv in _commands(block)]


@pytest.mark.parametrize("program, argv", _shell_commands())
def test_every_shell_example_parses(program: str, argv: list[str],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert command_error(program, argv) is None, capsys.readouterr().err


def test_the_checks_catch_what_they_look_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each check flags a planted mistake (so none of the tests above passes vacuously)."""
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "t" * 40)
    prose = ("`admin: {token_env: KVGATE_ADMIN_TOKEN, prot: 8001}` and "
             "`limits: {max_in_flight: 8}`; `timeouts.idle_s`, `timeouts.idel_s`; "
             "`kvgate_requests_total{replica}`, `kvgate_request_totals`, "
             "`vllm:request_{queue,queued}_time_seconds`, `vllm:cache_aware`, `kvgate_peer_*`, "
             "`kvgate_peers_*`")
    assert [e.split(":")[0] for e in inline_config_errors(prose)] == ["admin"]
    assert unknown_config_keys(prose) == ["timeouts.idel_s"]
    assert unknown_metrics(prose, _source_literals()) == [
        "kvgate_peers_*", "kvgate_request_totals", "vllm:request_queued_time_seconds"]
    assert command_error("kvgate", ["top", "--windw", "10"]) is not None
    assert command_error("kvgate", ["top", "--window", "10", "--once"]) is None
    assert command_error("loadtests.simulate", ["--scenario", "no-such"]) is not None
    assert len(_yaml_examples()) >= 5 and len(_shell_commands()) >= 8


def _served_paths() -> list[str]:
    """The paths the gateway's client listener routes, from the app it builds."""
    from gateway.app import create_app

    app: Any = create_app(parse_config({"replicas": [A_REPLICA]}))
    while not hasattr(app, "routes"):
        app = app.app  # the middleware it is wrapped in
    return [route.path for route in app.routes]


def test_every_endpoint_is_in_gateway_md() -> None:
    from gateway.admin import routes

    prose = _prose(ROOT / "docs" / "gateway.md")
    paths = [*_served_paths(), *(route.path for route in routes())]
    assert "/v1/chat/completions" in paths and "/admin/top" in paths
    # a {param}, or a {param:converter}, as the doc names it: {param}
    param = r"\\\{\w+(?::\w+)?\\\}"
    missing = [p for p in dict.fromkeys(paths)
               if not re.search("[` ]" + re.sub(param, r"\\{\\w+\\}", re.escape(p))
                                + "[`,)]", prose)]
    assert missing == []


def test_tenancy_md_names_every_pass_through_endpoint_that_is_salted() -> None:
    from gateway.passthrough import _NO_CACHE, PATHS

    prose = _prose(ROOT / "docs" / "tenancy.md")
    assert [p for p in PATHS if f"`{p}`" not in prose] == []
    assert sorted(_NO_CACHE) == sorted(re.findall(r"all but `(/\w+)` and `(/\w+)`", prose)[0])
