"""A secret configured in more than one place is refused, naming the places (one would
win silently: a rotated file behind a value left in the YAML was never read); the admin
API's ``allow_hosts`` match a replica's host name in any case, as host names do."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import AdminConfig
from kvwire.secret_source import resolve_secret

SECRET = "s" * 32


def test_one_source_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "secret"
    file.write_text(SECRET + "\n")
    monkeypatch.setenv("KVGATE_TEST_SECRET", " " + SECRET)
    assert resolve_secret(SECRET, None, None, "token") == SECRET
    assert resolve_secret(None, str(file), None, "token") == SECRET
    assert resolve_secret(None, None, "KVGATE_TEST_SECRET", "token") == SECRET
    assert resolve_secret(None, None, None, "token") is None


def test_a_secret_in_two_places_is_refused(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "secret"
    file.write_text(SECRET)
    monkeypatch.setenv("KVGATE_TEST_SECRET", SECRET)
    with pytest.raises(ValueError, match="token and token_file are set"):
        resolve_secret("x" * 32, str(file), None, "token")
    with pytest.raises(ValueError, match="secret_file and secret_env are set"):
        resolve_secret(None, str(file), "KVGATE_TEST_SECRET", "secret")
    with pytest.raises(ValueError, match="token and token_file are set"):
        AdminConfig(token=SECRET, token_file=str(file)).validate()


def test_allow_hosts_match_in_any_case() -> None:
    admin = AdminConfig(token=SECRET, allow_hosts=["Replica-0.Example.Internal"])
    assert admin.allows("http://replica-0.example.internal:8000")
    assert admin.allows("http://REPLICA-0.example.internal:8000")
    assert not admin.allows("http://replica-1.example.internal:8000")
