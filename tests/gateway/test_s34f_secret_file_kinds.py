"""A ``*_file`` secret that is not a regular file is refused at load, naming the key and the
path and what it is: a FIFO given as the admin token's file hung start-up without a word
(waiting for a writer), and a device would be read as if it held the secret."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.config import parse_config
from kvwire.secret_source import resolve_bearer
from policies.config import ConfigError


def _config(**extra: Any) -> Any:
    return parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:1"}],
                         "trusted_proxies": ["127.0.0.1/32"], **extra})


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _folder(tmp_path: Path) -> Path:
    return tmp_path


@pytest.mark.parametrize("make, kind", [
    (_fifo, "a FIFO"),
    (_folder, "a directory"),
    (lambda _: Path("/dev/zero"), "a character device"),
])
def test_a_secret_file_that_is_not_a_regular_file_is_refused_at_load(
        tmp_path: Path, make: Any, kind: str) -> None:
    path = make(tmp_path)
    for extra, where in [({"admin": {"token_file": str(path)}}, "token_file"),
                         ({"tenancy": {"isolate": True, "secret_file": str(path)}},
                          "secret_file"),
                         ({"auth": {"api_keys": [{"key_file": str(path)}]}}, "key_file"),
                         ({"peers": {"listen": "127.0.0.1:0", "secret_file": str(path)}},
                          "secret_file")]:
        with pytest.raises(ConfigError) as caught:
            _config(**extra)
        assert f"{where} {str(path)!r} is {kind}, not a regular file" in str(caught.value), \
            str(caught.value)


def test_the_engine_key_file_is_refused_as_the_gateways(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path)
    labels = ("--api-key", "--api-key-file", "KVGATE_ENGINE_API_KEY")
    with pytest.raises(ValueError, match=f"^--api-key-file {str(fifo)!r} is a FIFO, not a "
                                         "regular file"):
        resolve_bearer(None, str(fifo), None, "api key", "--api-key", labels=labels,
                       empty_refused=True)


def test_a_link_to_a_regular_file_is_read(tmp_path: Path) -> None:
    """A mounted Kubernetes Secret's file is a link to the file that holds it."""
    held = tmp_path / "..data" / "token"
    held.parent.mkdir()
    held.write_text("t" * 32 + "\n")
    link = tmp_path / "token"
    link.symlink_to(held)
    assert _config(admin={"token_file": str(link)}).admin.resolved_token() == "t" * 32
