"""Membership of an address in the configured networks (trusted proxies, replica hosts)."""

from __future__ import annotations

from gateway.networks import Networks


def test_an_ipv4_peer_on_a_dual_stack_listener_is_read_as_its_ipv4_address() -> None:
    trusted = Networks(["10.0.0.0/8", "fd00::/8"])
    assert trusted.holds("10.1.2.3") and trusted.holds("::ffff:10.1.2.3")
    assert trusted.holds("fd00::1")
    assert not trusted.holds("::ffff:192.168.1.1") and not trusted.holds("192.168.1.1")
    assert not trusted.holds("not an address") and not Networks([]).holds("10.1.2.3")
    # a network written in the mapped form still holds it
    assert Networks(["::ffff:0:0/96"]).holds("::ffff:10.1.2.3")
