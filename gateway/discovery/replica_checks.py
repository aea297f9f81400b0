"""Whether a replica a discovery source found may join the fleet.

A source's replicas are made of what its backend says (pod names, endpoint addresses, DNS
answers), which no operator wrote. Each passes the checks a replica of the config file
passes (``ReplicaConfig.validate``: its id is a metric label and a path segment of the
admin API, its URL and KV event endpoints are well formed, its data-parallel ranks can be
made) and is reached at an address a replica can have: an IP address (what an
EndpointSlice, a pod's status and a DNS answer give), and not the unspecified address
(``0.0.0.0``, ``::``: the gateway's own host), the IPv4 broadcast address or a multicast
one. Its API key is not read here: it is read as the replica joins, where a key file that
cannot be read is tried again at the next publish.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from urllib.parse import urlsplit

from gateway.config import ReplicaConfig, shown_url

BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def refusal(config: ReplicaConfig) -> str | None:
    """Why ``config`` may not join, naming the bad value (as ``repr`` shows it: no raw
    control character reaches a log line); None when it may."""
    try:
        replace(config, api_key=None, api_key_file=None, api_key_env=None).validate()
    except ValueError as exc:
        return str(exc)
    host = urlsplit(config.url).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"url {shown_url(config.url)}: its host is not an IP address"
    unfit = address_unfit(address)
    if unfit is not None:
        return f"url {shown_url(config.url)}: {host} is {unfit}, never a replica's address"
    return None


def address_unfit(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What ``address`` is when no replica can be reached at it (an IPv4 address written
    as IPv6, ``::ffff:0.0.0.0``, read as the IPv4 one); None for any other."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_unspecified:
        return "the unspecified address"
    if address == BROADCAST:
        return "the broadcast address"
    if address.is_multicast:
        return "a multicast address"
    return None


def shown_id(replica_id: str) -> str:
    """``replica_id`` for a log line: as it is when printable ASCII of an id's length,
    else its ``repr`` cut short (a newline in a pod's name forges no log line)."""
    if len(replica_id) <= 253 and replica_id.isascii() and replica_id.isprintable():
        return replica_id
    return repr(replica_id[:80]) + ("..." if len(replica_id) > 80 else "")
