"""Sets of IP networks from the config (trusted proxies, allowed replica hosts)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.requests import Request


class Networks:
    """A set of IP networks (``"10.0.0.0/8"``, ``"::1/128"``) and membership of a peer."""

    def __init__(self, networks: Sequence[str]) -> None:
        self._nets = [ipaddress.ip_network(n, strict=False) for n in networks]

    def __bool__(self) -> bool:
        return bool(self._nets)

    def peer_of(self, request: Request) -> bool:
        """Whether the request's direct peer is in one of the networks."""
        host = request.client.host if request.client else None
        if not host or not self._nets:
            return False
        return self.holds(host)

    def holds(self, host: str) -> bool:
        """Whether the address ``host`` is in one of the networks; an IPv4 address as an
        IPv6 socket names it (``::ffff:10.0.0.5``, on a dual-stack listener) is read as
        the IPv4 address it is."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            mapped = address.ipv4_mapped
            return any(mapped in net or address in net for net in self._nets)
        return any(address in net for net in self._nets)
