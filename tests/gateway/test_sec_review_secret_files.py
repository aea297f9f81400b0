"""A secret read from a file is read as UTF-8 text whatever the locale, and a file that
holds no usable secret (binary bytes, or far too much) is named at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config import parse_config
from policies.config import ConfigError

MAX_BYTES = 1 << 16


def _config(**extra: Any) -> Any:
    return parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:1"}],
                         "trusted_proxies": ["127.0.0.1/32"], **extra})


@pytest.mark.parametrize("content, message", [
    (b"\x9c\xff" + b"k" * 40, "is not UTF-8 text (byte 1 of it)"),
    (b"k" * (MAX_BYTES + 1), f"holds over {MAX_BYTES} bytes"),
])
def test_a_secret_file_that_is_no_secret_is_named_at_load(tmp_path: Path, content: bytes,
                                                          message: str) -> None:
    path = tmp_path / "secret"
    path.write_bytes(content)
    for extra, where in [({"admin": {"token_file": str(path)}}, "token_file"),
                         ({"tenancy": {"isolate": True, "secret_file": str(path)}},
                          "secret_file"),
                         ({"auth": {"api_keys": [{"key_file": str(path)}]}}, "key_file")]:
        with pytest.raises(ConfigError) as caught:
            _config(**extra)
        assert f"{where} {str(path)!r} {message}" in str(caught.value), str(caught.value)


def test_a_text_secret_file_is_read_without_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes("sécret-0123456789-0123456789-0123\n".encode())
    config = _config(tenancy={"isolate": True, "secret_file": str(path)})
    assert config.tenancy.salt_key() == "sécret-0123456789-0123456789-0123".encode()


def test_an_admin_token_file_changed_after_load_is_checked_when_read_again(
        tmp_path: Path) -> None:
    """The gateway reads the token again when it starts the admin API: a file rewritten
    since the config was loaded must not hand it a token the load would have refused."""
    path = tmp_path / "token"
    path.write_text("t" * 32 + "\n")
    config = _config(admin={"token_file": str(path)})
    assert config.admin.resolved_token() == "t" * 32
    path.write_text("short\n")
    with pytest.raises(ValueError, match="at least 16 characters, got 5"):
        config.admin.resolved_token()
