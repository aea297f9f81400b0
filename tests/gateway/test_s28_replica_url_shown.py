"""A replica URL the config refuses is named without the credentials it carried (an error
goes to the admin API's caller, a log, a terminal) and by its start only; a URL past
``MAX_URL_CHARS`` (a base path of 100,000 characters sent through the admin API) is
refused, naming its length."""

from __future__ import annotations

import pytest

from gateway.config import MAX_URL_CHARS, ReplicaConfig


@pytest.mark.parametrize("url", [
    "http://admin:s3cret-pass@10.0.0.1:8000",
    "https://s3cret-pass@10.0.0.1:8000/v1",
    "ftp://admin:s3cret-pass@10.0.0.1",
    "http://admin:s3cret-pass@10.0.0.1:99999",
])
def test_a_refused_url_is_named_without_its_credentials(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        ReplicaConfig("r", url).validate()
    said = str(refused.value)
    assert "s3cret-pass" not in said and "admin:" not in said, said
    assert "10.0.0.1" in said  # the URL is still recognisable


def test_a_url_past_the_limit_is_refused_by_its_length() -> None:
    url = "http://127.0.0.1:1/" + "a" * 100_000
    with pytest.raises(ValueError) as refused:
        ReplicaConfig("r", url).validate()
    said = str(refused.value)
    assert f"{len(url):,} characters" in said and f"{MAX_URL_CHARS:,}" in said
    assert len(said) < 400
    ReplicaConfig("r", "http://127.0.0.1:1/" + "a" * 100).validate()  # a long one passes
