"""The headers a client's request is forwarded with: the client's own, less the hop-by-hop
ones, with the client's address added to ``X-Forwarded-For`` and an ``X-Request-Id``
(the client's, or one the gateway makes) that the answer echoes.

``X-Forwarded-For``, ``Forwarded``, ``X-Real-IP`` and the other headers a proxy sets about
its client are believed only from a peer in ``trusted_proxies`` (the proxy in front of
the gateway that sets them); then the peer's address is appended to ``X-Forwarded-For``.
From anyone else they are dropped and ``X-Forwarded-For`` starts again with the peer's
address, so a replica's logs never show an address a client made up.

A client's ``X-Data-Parallel-Rank`` is dropped: which engine of a replica serves a request
is the gateway's to say (it sets the header toward a replica configured rank by rank).
"""

from __future__ import annotations

import uuid

from starlette.requests import Request

from gateway.data_parallel import RANK_HEADER
from gateway.networks import Networks
from gateway.proxy import forward_headers
from kvwire.openai_schema import BadRequest

# what only the proxy in front of the gateway may say about a request (its client's address,
# the host and scheme it was asked for): dropped from anyone else
_PROXY_SET = ("forwarded", "x-real-ip", "x-forwarded-host", "x-forwarded-proto",
              "x-forwarded-port", "x-client-ip", "true-client-ip")


def upstream_headers(request: Request, trusted: Networks,
                     tenant: tuple[str, str | None] | None = None) -> dict[str, str]:
    """The client's headers to forward (names are lower case, as ASGI gives them).
    ``tenant``: (the tenant header's name, the tenant the gateway settled on): the header
    then says that tenant, or is left out, whatever the client sent (a key's tenant is
    not the one a client may claim in the header)."""
    out = forward_headers(request.headers)
    out.pop("origin", None)  # a browser's: CORS is the gateway's to answer, not a replica's
    # vLLM and SGLang send a request to the engine it names, past their own balancing
    # (and refuse a rank they lack): toward a replica served as one, a client pinned all
    # its requests to one engine of it
    out.pop(RANK_HEADER, None)
    # an answer is read for its end, its errors and its usage: the client's gzip would let a
    # compressing hop before a replica hide them (a cut gzip stream passed for a whole one)
    out["accept-encoding"] = "identity"
    if tenant is not None:
        name, value = tenant
        name = name.lower()  # the forwarded names are lower case; the config's may not be
        out.pop(name, None)
        if value is not None:
            out[name] = value
    prior = out.pop("x-forwarded-for", None)
    if not trusted.peer_of(request):
        prior = None
        for name in _PROXY_SET:
            out.pop(name, None)
    peer = request.client.host if request.client else None
    if peer:
        out["x-forwarded-for"] = f"{prior}, {peer}" if prior else peer
    elif prior:
        out["x-forwarded-for"] = prior
    return out


def upstream_query(request: Request) -> str:
    """The client's query string as the replica is to get it: ``""`` when none, else ``?``
    and the string as sent (an Azure-style ``api-version``, a server's own switches). The
    HTTP parser took only visible ASCII into it; anything else is refused rather than
    written into the replica's request line."""
    raw: bytes = request.scope.get("query_string", b"")
    if not raw:
        return ""
    if not all(0x21 <= byte <= 0x7E and byte != 0x23 for byte in raw):
        raise BadRequest(f"the query string {raw[:64]!r} holds a character that no URL "
                         f"may carry (a space, a control character, '#' or non-ASCII)",
                         code="invalid_query")
    return "?" + raw.decode("ascii")


MAX_REQUEST_ID_CHARS = 256
REQUEST_ID_KEY = "kvgate.request_id"  # in the ASGI scope, once the request's id is chosen


def _sane(given: str) -> bool:
    """At most ``MAX_REQUEST_ID_CHARS`` visible ASCII characters (no space, no control
    character: an id cannot split a log line or a header); a client's tracing ids, base64
    and UUIDs in braces among them."""
    return 0 < len(given) <= MAX_REQUEST_ID_CHARS and given.isascii() and given.isprintable() \
        and " " not in given


def request_id_of(request: Request, headers: dict[str, str], made: str,
                  in_body: object = None) -> str:
    """The request's id: the client's ``X-Request-Id`` when it is a sane one, else the
    body's ``request_id`` (``in_body``: vLLM's own field, which the header would override
    there) when sane, else ``made``; set in ``headers`` (what is forwarded) and kept in the
    request's scope (for an error answered later) either way."""
    given = headers.get("x-request-id")
    chosen = given if given is not None and _sane(given) else \
        in_body if isinstance(in_body, str) and _sane(in_body) else made
    headers["x-request-id"] = chosen
    request.scope[REQUEST_ID_KEY] = chosen
    return chosen


def request_id_header(request: Request) -> dict[str, str]:
    """The ``X-Request-Id`` header of an answer the gateway makes itself (an error, or a
    route that goes to no replica): the id chosen for the request (the one its replicas
    saw), else the client's when sane, else a new one."""
    chosen = request.scope.get(REQUEST_ID_KEY)
    if chosen is None:
        given = request.headers.get("x-request-id")
        chosen = given if given is not None and _sane(given) else f"gw-{uuid.uuid4().hex}"
        request.scope[REQUEST_ID_KEY] = chosen  # the same in the access log and the answer
    return {"x-request-id": chosen}
