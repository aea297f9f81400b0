"""``kvgate serve`` refuses, in one line and before it binds anything, what could never
serve: a config that names nowhere to send requests, a config file that is no text, a
tokenizer file that is no tokenizer."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.processes import REPO


def serve(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvgate", "serve", "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


R0 = [{"id": "r0", "url": "http://127.0.0.1:9"}]


@pytest.mark.parametrize("content, said", [
    (yaml.safe_dump({"port": 18999}), "names no replica, no discovery and no admin API"),
    (yaml.safe_dump({"replicas": R0, "host": "not a host!!"}),
     "host 'not a host!!' cannot be listened on"),
    (yaml.safe_dump({"replicas": R0, "admin": {"token": "t" * 24, "host": "zzz.."}}),
     "admin.host 'zzz..' cannot be listened on"),
    (yaml.safe_dump({"replicas": R0, "port": 18998, "admin": {"token": "t" * 24,
                                                              "port": 18998}}),
     "admin.port 18998 is the gateway's own port"),
    (b"\x00\xff\xfe binary", "not a YAML file"),
    ("tokenizer", "cannot be read as a tokenizer"),
])
def test_a_gateway_that_could_never_serve_is_refused_at_start(
        tmp_path: Path, content: str | bytes, said: str) -> None:
    config = tmp_path / "gateway.yaml"
    if content == "tokenizer":
        broken = tmp_path / "tokenizer.json"
        broken.write_text("")
        content = yaml.safe_dump({"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
                                  "tokenizer": str(broken)})
    if isinstance(content, bytes):
        config.write_bytes(content)
    else:
        config.write_text(content)
    done = serve(config)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("where, reason", [
    ("a-file/capture.jsonl", "File exists"),  # its folder would be a file
    ("a-folder", "Is a directory"),
])
def test_a_capture_log_that_cannot_be_written_is_refused_at_start(
        tmp_path: Path, where: str, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway import serve as serve_cli

    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}],
        "capture": {"path": str(tmp_path / where)}}))
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    assert serve_cli.run(parser.parse_args(["--config", str(config)])) == 2  # nothing bound
    err = capsys.readouterr().err
    assert f"capture.path {str(tmp_path / where)!r}: cannot open it for appending: " \
        f"{reason}" in err and err.count("\n") == 1
