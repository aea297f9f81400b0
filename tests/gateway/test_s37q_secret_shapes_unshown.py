"""A secret written in the wrong shape or the wrong place is not printed by the start-up
error: a bare string where the config wants a mapping (``auth.api_keys: [sk-...]``,
``admin: sk-...``), an unknown key inside a secret-bearing section, and a secret pasted
into a ``*_env`` or ``*_file`` key. The error names where, and the value's type and length;
the other fields of those sections still show their bad values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.api_key import API_KEY_ENV, resolve_api_key
from gateway.config import load_config, parse_config
from policies.config import ConfigError

SECRET = "sk-LEAKED-0123456789abcdefgh"  # 28 characters
REPLICA = {"id": "r0", "url": "http://127.0.0.1:9"}


def _refused(**extra: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config({"replicas": [REPLICA], **extra})
    return str(caught.value)


@pytest.mark.parametrize("extra, said", [
    ({"auth": {"api_keys": [SECRET]}},
     "config.auth.api_keys[0]: expected a mapping, got a value of type str and length 28"),
    ({"auth": {"api_keys": SECRET}}, "config.auth.api_keys: expected a list, got a value of "
                                     "type str and length 28"),
    ({"auth": SECRET}, "config.auth: expected a mapping, got a value of type str"),
    ({"admin": SECRET}, "config.admin: expected a mapping, got a value of type str and "
                        "length 28 (not shown: 'admin' holds secrets)"),
    ({"admin": {SECRET: None}}, "config.admin: unknown key a value of type str and length "
                                "28"),
    ({"auth": {"api_keys": [{SECRET: None}]}}, "config.auth.api_keys[0]: unknown key a "
                                               "value of type str"),
    ({"admin": {"token": [SECRET]}}, "config.admin.token: expected a string, got a value "
                                     "of type list and length 1 (not shown: 'token' is a "
                                     "secret)"),
    ({"admin": {"token_env": SECRET}}, "config.admin: token_env (a name of 28 characters, "
                                       "not shown in case it is the secret) is not set"),
    ({"admin": {"token_file": SECRET}}, "config.admin: token_file (a path of 28 "
                                        "characters, not shown in case it is the secret): "
                                        "No such file"),
    ({"replicas": [{**REPLICA, "api_key_file": SECRET}]}, "config.replicas[0]: "
                                                          "api_key_file (a path of 28"),
    ({"replicas": [{**REPLICA, "api_key_env": SECRET}]}, "config.replicas[0]: "
                                                         "api_key_env (a name of 28"),
    ({"peers": {"secret_env": 12345678901234567890}}, "config.peers.secret_env: expected a "
                                                      "string, got a value of type int"),
])
def test_a_misplaced_secret_is_named_by_type_and_length(extra: dict[str, Any],
                                                        said: str) -> None:
    error = _refused(**extra)
    assert error.startswith(said), error
    assert SECRET not in error and "12345678901234567890" not in error


def test_the_start_up_error_of_a_file_does_not_show_it(tmp_path: Path) -> None:
    config = tmp_path / "auth.yaml"  # (a section's name as the file's: its values still shown)
    config.write_text(f'auth: {{api_keys: ["{SECRET}"]}}\nreplicas: [{{id: r0, url: '
                      '"http://127.0.0.1:9"}]\n')
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert SECRET not in str(caught.value)
    assert str(caught.value).startswith(f"{config}.auth.api_keys[0]: expected a mapping")
    config.write_text('replicas: [{id: "r0", url: "http://127.0.0.1:9", weight: "heavy"}]\n')
    with pytest.raises(ConfigError, match="weight: expected a finite number, got 'heavy'"):
        load_config(config)


def test_other_fields_of_a_secret_section_and_real_paths_are_still_shown(
        tmp_path: Path) -> None:
    assert "config.admin.port: expected an integer, got 'eighty'" in _refused(
        admin={"port": "eighty"})
    assert "tenant 'acme'" in _refused(auth={"api_keys": [
        {"key": "k" * 24, "tenant": "acme"}, {"key": "k" * 24, "tenant": "beta"}]})
    # a path that is there is named: it is no secret
    assert f"token_file {str(tmp_path)!r} is a directory" in _refused(
        admin={"token_file": str(tmp_path)})


def test_the_engine_does_not_show_a_key_file_path_that_names_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ValueError) as caught:
        resolve_api_key(None, SECRET)
    assert SECRET not in str(caught.value)
    assert str(caught.value).startswith("--api-key-file (a path of 28 characters")
