"""Start-up warns, a line each, of a secret the config exposes: a key file (a ``*_file``
secret of the gateway's config, the engine's ``--api-key-file``) that users other than its
owner may read or write, and a replica's API key sent over plain http:// to a host that is
not this machine."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from engine import cli as engine_cli
from engine.api_key import API_KEY_ENV
from gateway import serve as serve_cli
from gateway.config import parse_config

KEY = "key-0123456789abcdef0123"
NO_BLOCK = ["--kv-cache-gib", "1e-9"]  # the engine stops here, after reading its key


def _key_file(tmp_path: Path, name: str, mode: int) -> str:
    path = tmp_path / name
    path.write_text(f"{KEY}-{name}\n")  # each file's key its own
    path.chmod(mode)
    return str(path)


def _warnings(tmp_path: Path, **extra: Any) -> list[str]:
    return serve_cli.exposed_secrets(parse_config({
        "replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}], **extra}))


def test_a_key_file_others_may_read_is_warned_of(tmp_path: Path) -> None:
    open_file = _key_file(tmp_path, "open.key", 0o644)
    warnings = _warnings(
        tmp_path,
        admin={"token_file": _key_file(tmp_path, "admin.key", 0o600)},
        auth={"api_keys": [{"key_file": _key_file(tmp_path, "a.key", 0o400)},
                           {"key_file": _key_file(tmp_path, "b.key", 0o660)}]},
        tenancy={"secret_file": _key_file(tmp_path, "tenancy.key", 0o640)},
        replicas=[{"id": "r0", "url": "https://10.0.0.1:8000", "api_key_file": open_file}])
    assert sorted(warnings) == [
        f"auth.api_keys[1].key_file {str(tmp_path / 'b.key')!r} has permissions 0660: users "
        "other than its owner may read or write the secret in it; chmod 600 it (640 where "
        "the process reads it as its group)",
        f"replicas[0].api_key_file {open_file!r} has permissions 0644: users other than its "
        "owner may read or write the secret in it; chmod 600 it (640 where the process "
        "reads it as its group)",
        f"tenancy.secret_file {str(tmp_path / 'tenancy.key')!r} has permissions 0640: users "
        "other than its owner may read or write the secret in it; chmod 600 it (640 where "
        "the process reads it as its group)"]
    assert all(KEY not in warning for warning in warnings)


@pytest.mark.parametrize("url, warned", [
    ("http://10.0.0.7:8000", True), ("http://vllm.internal:8000/vllm", True),
    ("http://[2001:db8::1]:8000", True), ("https://10.0.0.7:8000", False),
    ("http://127.0.0.1:8000", False), ("http://[::1]:8000", False),
    ("http://localhost:8000", False)])
def test_a_replica_key_sent_in_clear_to_another_host_is_warned_of(
        tmp_path: Path, url: str, warned: bool) -> None:
    keyed = _warnings(tmp_path, replicas=[{"id": "r0", "url": url, "api_key": KEY}])
    host = url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
    assert keyed == ([f"replicas[0] (r0) is sent its API key over plain http:// to {host}, "
                      "readable on the network: use https:// or a private network"]
                     if warned else [])
    # no key, nothing to warn of
    assert _warnings(tmp_path, replicas=[{"id": "r0", "url": url}]) == []


def test_the_gateway_warns_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a-folder").mkdir()  # an unwritable capture log: start stops, unbound
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps({
        "replicas": [{"id": "r0", "url": "http://192.0.2.10:8000",
                      "api_key_file": _key_file(tmp_path, "r0.key", 0o666)}],
        "capture": {"path": str(tmp_path / "a-folder")}}))
    with caplog.at_level(logging.WARNING, "kvgate"):
        assert serve_cli.run(argparse.Namespace(config=str(path), host=None, port=None,
                                                workers=1)) == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2, warned
    assert warned[0].startswith("replicas[0].api_key_file ") and "0666" in warned[0]
    assert warned[1].startswith("replicas[0] (r0) is sent its API key over plain http://")


def test_the_engine_warns_of_an_open_key_file(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    for mode, warned in ((0o644, True), (0o600, False)):
        caplog.clear()
        key_file = _key_file(tmp_path, f"engine-{mode:o}.key", mode)
        with caplog.at_level(logging.WARNING, "engine"):
            assert engine_cli.main(["--api-key-file", key_file, *NO_BLOCK]) == 2
        said = [r.getMessage() for r in caplog.records if "--api-key-file" in r.getMessage()]
        assert said == ([f"--api-key-file {key_file!r} has permissions 0644: users other "
                         "than its owner may read or write the secret in it; chmod 600 it "
                         "(640 where the process reads it as its group)"] if warned else [])
