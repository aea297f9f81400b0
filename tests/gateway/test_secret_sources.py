"""A secret configured in more than one place is refused, naming the places (one would
win silently: a rotated file behind a value left in the YAML was never read); an empty
source is none, unless giving one says a secret is wanted (a command's flags); the admin
API's ``allow_hosts`` match a replica's host name in any case, as host names do."""

from __future__ import annotations

import re
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


def test_an_empty_source_is_none_unless_given_means_wanted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blank = tmp_path / "blank"
    blank.write_text(" \n")
    monkeypatch.setenv("KVGATE_TEST_SECRET", "\t")
    flags = ("--key", "--key-file", "KVGATE_TEST_SECRET")
    # in a config an empty source is none: it neither stands beside another nor names one
    assert resolve_secret("", str(blank), "", "token") is None
    assert resolve_secret(None, None, "KVGATE_TEST_SECRET", "token") is None
    assert resolve_secret("", None, "", "token") is None
    # for a command's flags, giving one says a secret is wanted: empty, it is named
    for given, said in (((str(blank), None), f"--key-file {str(blank)!r} holds no key"),
                        ((None, "KVGATE_TEST_SECRET"), "KVGATE_TEST_SECRET is empty")):
        with pytest.raises(ValueError, match="^" + re.escape(said) + ": give the key, or "
                           "none of --key, --key-file and KVGATE_TEST_SECRET"):
            resolve_secret(None, *given, "key", flags, empty_refused=True)
    with pytest.raises(ValueError, match=r"^--key is empty"):
        resolve_secret("", None, None, "key", flags, empty_refused=True)
    with pytest.raises(ValueError, match=r"^--key and --key-file are set"):
        resolve_secret("", str(blank), None, "key", flags, empty_refused=True)
    assert resolve_secret(None, None, None, "key", flags, empty_refused=True) is None
