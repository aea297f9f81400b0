"""Secrets a client presents in ``Authorization: Bearer`` (the admin token, client API
keys, a replica's key) are refused at load when no HTTP request could carry them as
written, naming the entry and never the secret."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import parse_config
from policies.config import ConfigError

TOKEN = "admin-token-0123456789"


def _config(**extra: Any) -> Any:
    return parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:1"}], **extra})


@pytest.mark.parametrize("secret, kind", [
    (TOKEN + " ", "space or tab"), ("\t" + TOKEN, "space or tab"),
    (TOKEN + "\n", "control character"), (TOKEN.replace("-", "\u00e9"), "non-ASCII"),
])
def test_a_secret_no_header_carries_is_refused_at_load(secret: str, kind: str) -> None:
    replica = {"id": "a", "url": "http://127.0.0.1:1", "api_key": secret}
    for extra, where in [({"admin": {"token": secret}}, "config.admin: the admin token"),
                         ({"auth": {"api_keys": [{"key": secret, "tenant": "t"}]}},
                          "config.auth.api_keys[0]: an api key"),
                         ({"replicas": [replica]}, "config.replicas[0]: api_key")]:
        with pytest.raises(ConfigError) as caught:
            _config(**extra)
        message = str(caught.value)
        assert message.startswith(where) and kind in message, message
        assert secret.strip() not in message


def test_a_secret_with_spaces_inside_is_kept() -> None:
    config = _config(admin={"token": "admin token 0123456789"},
                     auth={"api_keys": [{"key": "a key of 16 chars or more"}]})
    assert config.admin.resolved_token() == "admin token 0123456789"
