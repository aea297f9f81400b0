"""A replica the gateway cannot reach is named to the client by its id and the kind of
failure (unreachable, TLS failed, timed out connecting): never its address, port, the OS's
error or TLS's words, which go to the gateway's log and /admin/replicas' ``last_error``."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.upstream_http import UpstreamBroken, UpstreamClient, UpstreamUnreachable
from tests.support.gateway_harness import AUTH, start_gateway
from tests.support.private_ca import make_certs
from tests.support.servers import ThreadServer, free_port

Serve = Callable[..., ThreadServer]
BODY = {"model": "m", "prompt": "hi", "max_tokens": 1}


@pytest.fixture
def untrusted_tls(tmp_path: Path) -> Iterator[int]:
    """A TLS listener whose certificate a private CA no one trusts signed: its port."""
    certs = make_certs(tmp_path)
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(certs.cert, certs.key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    done = threading.Event()

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            if done.is_set():  # the teardown's own connection
                conn.close()
                return
            try:
                served.wrap_socket(conn, server_side=True).close()
            except OSError:  # the gateway refused the certificate (ssl.SSLError)
                pass
            finally:
                conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        done.set()
        socket.create_connection(("127.0.0.1", port)).close()  # wakes the accept
        thread.join(5)
        listener.close()


def _failure(serve: Serve, url: str) -> tuple[str, str]:
    """The client's 502 message for a request to the one replica at ``url``, and that
    replica's ``last_error`` on the admin API once the request ejected it."""
    # one failed check does not eject it, and the next is a minute away: the request goes
    gw = start_gateway(serve, [("r0", url)], max_attempts=1,
                       health={"interval_s": 60, "timeout_s": 2, "failures_to_eject": 2})
    got = httpx.post(f"{gw.url}/v1/completions", json=BODY)
    assert got.status_code == 502, got.text
    replicas = httpx.get(f"{gw.admin}/admin/replicas", headers=AUTH).json()["replicas"]
    return got.json()["error"]["message"], replicas[0]["last_error"]


def test_an_unreachable_replica_is_named_without_its_address(serve: Serve) -> None:
    port = free_port()  # nothing listens there
    message, last_error = _failure(serve, f"http://127.0.0.1:{port}")
    assert message.startswith("replica 'r0' is unreachable"), message
    assert str(port) not in message and "127.0.0.1" not in message
    assert "Errno" not in message and "refused" not in message.lower()
    assert f"cannot connect to 127.0.0.1:{port}" in last_error  # the detail, for the operator


def test_a_failed_certificate_is_named_without_tls_detail(serve: Serve,
                                                          untrusted_tls: int) -> None:
    message, last_error = _failure(serve, f"https://127.0.0.1:{untrusted_tls}")
    assert message.startswith("replica 'r0' is unreachable (TLS failed)"), message
    assert str(untrusted_tls) not in message and "certificate" not in message
    assert f"TLS with 127.0.0.1:{untrusted_tls} failed" in last_error
    assert "CERTIFICATE_VERIFY_FAILED" in last_error and "tls: {ca_file" in last_error


async def test_each_failure_keeps_its_detail_and_tells_its_kind() -> None:
    port = free_port()
    client = UpstreamClient(connect_s=5)
    try:
        with pytest.raises(UpstreamUnreachable) as refused:
            await client.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
    finally:
        await client.close()
    assert refused.value.cause == "is unreachable"
    assert f"127.0.0.1:{port}" in str(refused.value)
    # a connect past connect_s (an address that drops the SYN is not at hand): the kind
    assert UpstreamBroken("no connection to 10.0.0.1:8000 within 2 s",
                          "timed out connecting").cause == "timed out connecting"
    assert UpstreamBroken("the connection broke (reset)").cause == "broke the connection"
