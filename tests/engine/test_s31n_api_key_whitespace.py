"""The engine's API key, as docs/replicas.md says: the file's and the variable's
surrounding whitespace is stripped (a mounted Secret's trailing newline), while
``--api-key`` is taken as written, so a space at either end of it stops the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.api_key import API_KEY_ENV, resolve_api_key

KEY = "engine-key-0123456789abcdef"


def test_the_file_and_the_variable_are_stripped_the_flag_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(f" {KEY}\n")
    assert resolve_api_key(None, str(key_file)) == KEY
    with pytest.raises(ValueError, match="the API key starts or ends with a space") as err:
        resolve_api_key(f" {KEY}", None)
    assert KEY not in str(err.value)
    monkeypatch.setenv(API_KEY_ENV, f"\t{KEY} \n")
    assert resolve_api_key(None, None) == KEY
