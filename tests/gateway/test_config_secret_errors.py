"""A config error on a secret field (an unquoted numeric token in the YAML) names the field
and the value's type, never the value: start-up errors go to stderr and the logs."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from policies.config import ConfigError

SECRET = 98765432109876543210


@pytest.mark.parametrize("config, where", [
    ({"admin": {"token": SECRET}}, "config.admin.token"),
    ({"auth": {"api_keys": [{"key": SECRET}]}}, "config.auth.api_keys[0].key"),
    ({"tenancy": {"secret": SECRET}}, "config.tenancy.secret"),
])
def test_a_secret_of_the_wrong_type_is_named_but_not_shown(config: dict[str, object],
                                                            where: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"replicas": [], **config})
    assert str(err.value).startswith(f"{where}: expected a string, got a value of type int")
    assert str(SECRET) not in str(err.value)


def test_other_fields_still_show_the_bad_value() -> None:
    with pytest.raises(ConfigError, match=r"config.admin.host: expected a string, got 12345"):
        parse_config({"replicas": [], "admin": {"host": 12345}})
