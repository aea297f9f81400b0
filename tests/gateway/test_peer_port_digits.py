"""A peer address's port is ASCII digits: other scripts' digits (which str.isdigit and int
take) are no port a resolver or socket is given."""

from __future__ import annotations

import pytest

from gateway.peer_config import split_address


@pytest.mark.parametrize("value", ["gw:\u0663", "gw:8\u0660\u0660\u0662", "gw:\uff18"])
def test_a_port_of_non_ascii_digits_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValueError, match="is not host:port") as refused:
        split_address(value, "addresses[0]")
    assert repr(value) in str(refused.value)


def test_ascii_ports_are_taken() -> None:
    assert split_address("gw:8002", "addresses[0]") == ("gw", 8002)
    assert split_address("[::1]:0", "listen", any_port=True) == ("::1", 0)
