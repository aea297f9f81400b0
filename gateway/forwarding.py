"""The headers a client's request is forwarded with: the client's own, less the hop-by-hop
ones, with the client's address added to ``X-Forwarded-For`` and an ``X-Request-Id``
(the client's, or one the gateway makes) that the answer echoes.

``X-Forwarded-For`` and ``Forwarded`` a client sends are believed only from a peer in
``trusted_proxies`` (the proxy in front of the gateway that sets them); then the peer's
address is appended. From anyone else they are dropped and ``X-Forwarded-For`` starts
again with the peer's address, so a replica's logs never show an address a client made up.
"""

from __future__ import annotations

from starlette.requests import Request

from gateway.networks import Networks
from gateway.proxy import forward_headers


def upstream_headers(request: Request, trusted: Networks) -> dict[str, str]:
    """The client's headers to forward (names are lower case, as ASGI gives them)."""
    out = forward_headers(request.headers)
    prior = out.pop("x-forwarded-for", None)
    if not trusted.peer_of(request):
        prior = None
        out.pop("forwarded", None)
    peer = request.client.host if request.client else None
    if peer:
        out["x-forwarded-for"] = f"{prior}, {peer}" if prior else peer
    elif prior:
        out["x-forwarded-for"] = prior
    return out


_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/")


def request_id_of(headers: dict[str, str], made: str) -> str:
    """The request's id: the client's ``X-Request-Id`` when it is a sane one (at most 128
    characters of letters, digits and ``-_.:/``), else ``made``; set in ``headers`` (what
    is forwarded) either way."""
    given = headers.get("x-request-id")
    chosen = given if given and len(given) <= 128 and set(given) <= _ID_CHARS else made
    headers["x-request-id"] = chosen
    return chosen
