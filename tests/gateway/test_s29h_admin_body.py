"""The admin API reads a body as the client routes and ``/admin/explain`` do: within
``limits.body_timeout_s`` (a caller that sends a head and part of a body gets a 408, not a
connection held for good) and uncompressed (a gzip body is a 415 naming its encoding, not
"not valid JSON")."""

from __future__ import annotations

import gzip
import json
import socket

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import ADMIN_TOKEN, AUTH, Serve, start_gateway


def test_an_added_replicas_body_that_never_ends_gets_the_body_timeout(serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("r0")))
    gw = start_gateway(serve, [("r0", replica.url)], limits={"body_timeout_s": 0.3})
    body = json.dumps({"id": "r1", "url": replica.url}).encode()
    host, port = gw.admin.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=3) as sock:
        sock.sendall(b"POST /admin/replicas HTTP/1.1\r\nhost: gw\r\n"
                     b"authorization: Bearer " + ADMIN_TOKEN.encode() + b"\r\n"
                     b"content-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n" % len(body) + body[:10])
        answer = b""
        while not answer.rstrip().endswith(b"}"):  # the rest of the body never comes
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert json.loads(payload)["error"]["code"] == "body_timeout"
    listed = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    assert [r["id"] for r in listed] == ["r0"]


def test_an_added_replicas_compressed_body_is_refused_naming_its_encoding(
        serve: Serve) -> None:
    replica = serve(fake_replica(Behaviour("r0")))
    gw = start_gateway(serve, [("r0", replica.url)])
    other = serve(fake_replica(Behaviour("r1")))  # a server of its own: one url, one replica
    body = json.dumps({"id": "r1", "url": other.url}).encode()
    r = httpx.post(f"{gw.admin}/admin/replicas", content=gzip.compress(body), timeout=10,
                   headers={**AUTH, "content-type": "application/json",
                            "content-encoding": "gzip"})
    assert r.status_code == 415, r.text
    assert r.headers["accept-encoding"] == "identity"
    error = r.json()["error"]
    assert error["code"] == "unsupported_content_encoding" and "'gzip'" in error["message"]
    # the same body uncompressed adds the replica
    r = httpx.post(f"{gw.admin}/admin/replicas", content=body, timeout=10,
                   headers={**AUTH, "content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["id"] == "r1"
