"""The trace exporter's endpoint: a port that cannot be connected to is refused with the
config, naming the endpoint."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from policies.config import ConfigError


@pytest.mark.parametrize(("endpoint", "why"), [
    ("http://collector:0/v1/traces", "port 0"),
    ("http://collector:99999/v1/traces", "bad port"),
    ("http://collector:x/v1/traces", "bad port"),
])
def test_an_endpoint_with_a_port_no_collector_can_have_is_refused(endpoint: str,
                                                                 why: str) -> None:
    with pytest.raises(ConfigError, match=why) as refused:
        parse_config({"tracing": {"endpoint": endpoint}})
    assert endpoint in str(refused.value)


def test_an_endpoint_with_or_without_a_port_is_taken() -> None:
    for endpoint in ("http://collector:4318/v1/traces", "https://collector/v1/traces"):
        assert parse_config({"tracing": {"endpoint": endpoint}}).tracing.endpoint == endpoint
