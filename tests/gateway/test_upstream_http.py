"""The gateway's HTTP/1.1 client against scripted servers (real sockets on loopback): each
framing of an answer, keep-alive reuse and its limits, and every way a replica can fail."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gateway.upstream_http import UpstreamBroken, UpstreamClient, UpstreamUnreachable
from tests.support.binaries import which
from tests.support.servers import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


class Server:
    """A loopback server answering each request with ``handler(reader, writer, n)`` (n:
    the request's number on its connection); the handler says whether to keep the
    connection open for another request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def __aenter__(self) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            n = 0
            try:
                while True:
                    head, body = await read_request(reader)
                    self.heads.append(head)
                    self.bodies.append(body)
                    if not await self.handler(reader, writer, n):
                        break
                    n += 1
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()
        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/completions"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()


def answer(body: bytes, *headers: str) -> bytes:
    extra = "".join(f"{h}\r\n" for h in headers)
    return (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra}"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def answering(body: bytes) -> Handler:
    """A handler answering ``body`` to every request and keeping the connection."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(answer(body))
        await writer.drain()
        return True
    return handler


async def read_all(client: UpstreamClient, url: str, body: bytes = b"{}") -> tuple[int, bytes]:
    response = await client.post(url, body, {"x-request-id": "t1"})
    out = b""
    while chunk := await response.readany():
        out += chunk
    response.release()
    return response.status, out  # the answer's own: release() hands on the connection only


def test_a_kept_alive_connection_carries_the_next_request() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(answer(b'{"n": %d}' % n))
        await writer.drain()
        return True

    async def main() -> None:
        server = Server(handler)
        async with server as url:
            client = UpstreamClient()
            assert await read_all(client, url, b'{"a": 1}') == (200, b'{"n": 0}')
            assert await read_all(client, url) == (200, b'{"n": 1}')
            await client.close()
        assert server.connections == 1
        head = server.heads[0].decode()
        assert head.startswith("POST /v1/completions HTTP/1.1\r\n")
        assert "\r\nhost: 127.0.0.1:" in head and "\r\nx-request-id: t1\r\n" in head
        assert server.bodies[0] == b'{"a": 1}'
    asyncio.run(main())


def test_chunked_and_close_delimited_answers_arrive_whole_and_close_is_not_kept() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        if n == 0:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for part in (b"data: 1\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end")
        return False  # the body ends with the connection

    async def main() -> None:
        server = Server(handler)
        async with server as url:
            client = UpstreamClient()
            response = await client.post(url, b"{}", {})
            assert response.headers["content-type"] == "text/event-stream"
            parts = []
            while chunk := await response.readany():
                parts.append(chunk)
            assert b"".join(parts) == b"data: 1\n\ndata: [DONE]\n\n" and len(parts) == 2
            response.release()
            assert await read_all(client, url) == (200, b"to the end")
            assert await read_all(client, url) == (200, b"data: 1\n\ndata: [DONE]\n\n")
            await client.close()
        assert server.connections == 2  # the close-delimited answer's was not kept
    asyncio.run(main())


def test_a_replica_closing_a_kept_connection_as_a_request_comes_is_sent_again() -> None:
    """The replica closes its idle connection just as the next request is written: the
    client sends it again on a new connection, and the caller sees one answer."""
    ok = answering(b"ok")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        if n == 1:
            return False  # read the second request, close without a byte
        return await ok(reader, writer, n)

    async def main() -> None:
        server = Server(handler)
        async with server as url:
            client = UpstreamClient()
            first = await client.post(url, b"{}", {})
            assert not first.resent and await first.read(100) == b"ok"
            first.release()
            again = await client.post(url, b"{}", {})
            assert again.resent and await again.read(100) == b"ok"  # the caller is told
            again.release()
            await client.close()
        assert server.connections == 2 and len(server.bodies) == 3
    asyncio.run(main())


def closes_the_second_after(delay_s: float) -> Handler:
    """A handler answering "ok" to a connection's first request and closing it without a
    byte ``delay_s`` after its second came."""
    ok = answering(b"ok")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        if n == 1:
            await asyncio.sleep(delay_s)
            return False
        return await ok(reader, writer, n)
    return handler


def test_a_replica_that_held_a_request_then_closed_its_kept_connection_is_not_sent_it_again(
        ) -> None:
    """The replica takes the request on a kept-alive connection, works on it, and closes
    without a byte: it may have run it, so the request is not sent again."""
    async def main() -> None:
        server = Server(closes_the_second_after(0.5))  # past STALE_WINDOW_S
        async with server as url:
            client = UpstreamClient()
            assert await read_all(client, url) == (200, b"ok")
            with pytest.raises(UpstreamBroken, match="the connection broke"):
                await client.post(url, b"{}", {})
            await client.close()
        assert server.connections == 1 and len(server.bodies) == 2
    asyncio.run(main())


def post_is_broken(handler: Handler, match: str) -> None:
    """A request to a server answering with ``handler`` raises UpstreamBroken (``match``)."""
    async def main() -> None:
        async with Server(handler) as url:
            client = UpstreamClient()
            with pytest.raises(UpstreamBroken, match=match):
                await client.post(url, b"{}", {})
            await client.close()
    asyncio.run(main())


def test_a_new_connection_closed_without_an_answer_is_broken() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        return False

    post_is_broken(handler, "the connection broke")


def test_an_answer_cut_mid_body_raises_where_it_is_read() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(answer(b"0123456789")[:-4])  # six of its ten body bytes
        await writer.drain()
        return False

    async def main() -> None:
        async with Server(handler) as url:
            client = UpstreamClient()
            response = await client.post(url, b"{}", {})
            assert await response.readany() == b"012345"
            with pytest.raises(UpstreamBroken):
                await response.readany()
            assert not response.is_eof()
            response.close()
            await client.close()
    asyncio.run(main())


def test_a_closed_port_is_unreachable_and_a_line_break_in_a_header_is_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the client connects

    async def main() -> None:
        client = UpstreamClient()
        with pytest.raises(UpstreamUnreachable, match=f"127.0.0.1:{port}"):
            await client.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
        with pytest.raises(ValueError, match="'x-evil' holds a line break"):
            await client.post(f"http://127.0.0.1:{port}/", b"", {"x-evil": "a\r\nb: c"})
        with pytest.raises(ValueError, match="not an http"):
            await client.post("ftp://127.0.0.1/", b"", {})
        await client.close()
    asyncio.run(main())


def test_at_most_the_limit_of_connections_are_open_to_one_replica() -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\no")
        await writer.drain()
        await release.wait()
        writer.write(b"k")
        await writer.drain()
        return True

    async def main() -> None:
        server = Server(handler)
        async with server as url:
            client = UpstreamClient(limit_per_origin=2)
            first = await client.post(url, b"1", {})
            second = await client.post(url, b"2", {})
            third = asyncio.create_task(client.post(url, b"3", {}))
            await asyncio.sleep(0.1)
            assert not third.done() and server.connections == 2  # waits for a connection
            release.set()
            assert await first.read(2) == b"ok"
            first.release()
            response = await asyncio.wait_for(third, 5)
            assert await response.read(2) == b"ok" and server.connections == 2
            assert await second.read(2) == b"ok"
            second.close()
            response.release()
            await client.close()
    asyncio.run(main())


def test_a_large_answer_read_slowly_arrives_intact() -> None:
    """Reading pauses while 256 KB wait unread and resumes as they are read: a 4 MB
    body read in small sips comes through byte for byte."""
    body = bytes(range(256)) * (16 * 1024)

    async def main() -> None:
        async with Server(answering(body)) as url:
            client = UpstreamClient()
            response = await client.post(url, b"{}", {})
            await asyncio.sleep(0.2)  # the replica sends all it can meanwhile
            assert response._buffered < 2 * 1024 * 1024  # paused long before the end
            got = bytearray()
            while chunk := await response.readany():
                got += chunk
                await asyncio.sleep(0)
            assert bytes(got) == body
            response.release()
            await client.close()
    asyncio.run(main())


def test_an_https_replica_is_reached_over_verified_tls(tmp_path: Path) -> None:
    """A replica behind TLS answers when its certificate verifies, and is unreachable
    (naming TLS) when it does not."""
    openssl = which("openssl", "apt-get install openssl")
    if openssl is None:
        pytest.skip("no openssl binary to make a certificate with")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b"secret"))
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=served)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
        try:
            trusting = UpstreamClient(ssl_context=ssl.create_default_context(cafile=cert))
            assert await read_all(trusting, url) == (200, b"secret")
            await trusting.close()
            default = UpstreamClient()  # the system's CAs: the certificate is unknown
            with pytest.raises(UpstreamUnreachable, match=r"TLS with 127\.0\.0\.1"):
                await default.post(url, b"{}", {})
            await default.close()
        finally:
            server.close()
    asyncio.run(main())


def test_header_values_go_out_as_the_client_sent_them() -> None:
    """A value the server decoded as latin-1 goes out as those bytes again; one beyond
    latin-1 (a configured key, say) as UTF-8."""
    async def main() -> None:
        server = Server(answering(b"ok"))
        async with server as url:
            client = UpstreamClient()
            for value in ("caf\xe9", "key-\u20ac"):
                response = await client.post(url, b"{}", {"x-note": value})
                assert await response.read(2) == b"ok"
                response.release()
            await client.close()
        assert b"\r\nx-note: caf\xe9\r\n" in server.heads[0]
        assert "\r\nx-note: key-\u20ac\r\n".encode() in server.heads[1]
    asyncio.run(main())


def test_an_interim_answer_is_skipped_and_the_final_one_read_on_the_same_connection(
        ) -> None:
    # a replica that sends 100 Continue (or 103 Early Hints) before its answer: the
    # answer is the final one, and the connection carries the next request only after it
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n")
        writer.write(answer(b'{"answer to": %d}' % n))
        await writer.drain()
        return True

    async def main() -> None:
        server = Server(handler)
        async with server as url:
            client = UpstreamClient()
            for n in range(3):
                status, body = await read_all(client, url)
                assert (status, body) == (200, b'{"answer to": %d}' % n)
            response = await client.post(url, b"{}", {})
            assert "link" not in response.headers  # the interim answer's headers are gone
            response.close()
            await client.close()
        assert server.connections == 1  # one kept-alive connection carried every request
    asyncio.run(main())


def test_an_endless_head_is_cut_at_its_bound() -> None:
    # a replica whose one header never ends: the parser would keep all of it
    sent = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nx-big: ")
        for _ in range(256):  # up to 16 MiB, while the client reads
            writer.write(b"a" * 65536)
            await writer.drain()
            sent[0] += 65536
        return False

    post_is_broken(handler, "head passed")
    assert sent[0] < 8 << 20  # the client hung up near its 1 MiB bound, not at the end


def test_an_idle_connection_is_closed_after_idle_s_with_no_request_to_come() -> None:
    """A replica that leaves the fleet gets no more requests: its kept-alive connections
    were closed only when a later request to it took one, so they stayed open for good
    (and the client kept its origin). Now a timer closes them, and the origin goes."""
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(answer(b"{}"))
        await writer.drain()
        if not await reader.read(1):  # the client closed the kept-alive connection
            closed.set()
        return False

    async def main() -> None:
        async with Server(handler) as url:
            client = UpstreamClient(idle_s=0.2)
            assert await read_all(client, url) == (200, b"{}")
            await asyncio.wait_for(closed.wait(), 2)
            assert client._origins == {} and client._targets == {}
            assert await read_all(client, url) == (200, b"{}")  # made again when asked
            await client.close()
    asyncio.run(main())


def test_trailer_lines_without_end_break_the_answer() -> None:
    """A chunked body, then trailer lines for ever: each one was kept (gigabytes in
    seconds), its bytes keeping the idle timeout away. Now they count with the head."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n")
        try:
            for i in range(100_000):
                writer.write(b"x-t%d: %s\r\n" % (i, b"v" * 100))
                await writer.drain()
        except ConnectionError:
            pass
        return False

    async def main() -> None:
        async with Server(handler) as url:
            client = UpstreamClient()
            response = await client.post(url, b"{}", {})
            with pytest.raises(UpstreamBroken, match="trailers passed"):
                while await asyncio.wait_for(response.readany(), 10):
                    pass
            await client.close()
    asyncio.run(main())


def test_a_second_answer_past_the_end_of_the_first_breaks_it_not_joins_it() -> None:
    """Bytes past an answer's length that parse as another answer: the answer asked for
    is broken (its length was wrong), not given the second one's status and body."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        second = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nEVIL"
        writer.write(answer(b"hello") + second)
        await writer.drain()
        return True

    async def main() -> None:
        async with Server(handler) as url:
            client = UpstreamClient()
            response = await client.post(url, b"{}", {})
            assert response.status == 200
            assert await response.readany() == b"hello"
            with pytest.raises(UpstreamBroken, match="past the end of its answer"):
                await response.readany()
            assert response.status == 200 and not response.is_eof()
            response.release()  # not kept: closed
            await client.close()
    asyncio.run(main())


def test_an_origin_whose_last_connection_closed_in_use_or_never_opened_is_forgotten() -> None:
    """Only the idle timer forgot an origin: one whose last connection closed while in
    use (``connection: close``, a broken answer, a client that left), or that no
    connection could reach, was kept for good, one per replica address ever seen."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        writer.write(answer(b"{}", "connection: close"))
        await writer.drain()
        return False

    closed_port = free_port()

    async def main() -> None:
        async with Server(handler) as url:
            client = UpstreamClient()
            assert await read_all(client, url) == (200, b"{}")
            assert client._origins == {} and client._targets == {}
            with pytest.raises(UpstreamUnreachable):
                await client.post(f"http://127.0.0.1:{closed_port}/", b"{}", {})
            assert client._origins == {} and client._targets == {}
            assert await read_all(client, url) == (200, b"{}")  # made again when asked
            await client.close()
    asyncio.run(main())


def _408_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\n"
                 b"content-length: 0\r\n\r\n")
    return False


def test_a_408_on_a_kept_connection_is_sent_again_and_on_a_new_one_is_the_answer() -> None:
    """A server that answers 408 as it closes an idle connection (HAProxy's, some of
    Node's) crossed the request: it never came whole, so it goes again on a new
    connection. On a new connection a 408 is the replica's answer."""
    ok = answering(b"ok")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      n: int) -> bool:
        if n == 1:
            return _408_then_close(reader, writer)
        return await ok(reader, writer, n)

    async def always_408(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         n: int) -> bool:
        return _408_then_close(reader, writer)

    async def main() -> None:
        server = Server(handler)
        async with server as url:
            client = UpstreamClient()
            assert await read_all(client, url) == (200, b"ok")
            again = await client.post(url, b"{}", {})
            assert again.resent and again.status == 200 and await again.read(100) == b"ok"
            again.release()
            await client.close()
        assert server.connections == 2 and len(server.bodies) == 3
        async with Server(always_408) as url:
            client = UpstreamClient()
            assert await read_all(client, url) == (408, b"")
            await client.close()
    asyncio.run(main())


@pytest.mark.parametrize("connect_s, resent", [(0.0, False), (0.5, True)])
def test_the_window_for_an_idle_close_grows_with_the_connections_round_trip(
        connect_s: float, resent: bool) -> None:
    """A replica closes its kept connection 0.2 s after the request came, without a byte:
    past ``STALE_WINDOW_S`` on loopback, a break; on a connection whose connect took 0.5 s
    (a replica 250 ms away, set here: loopback has no such distance), within two round
    trips of the send, as an idle close crossing the request arrives there."""
    async def main() -> None:
        server = Server(closes_the_second_after(0.2))
        async with server as url:
            client = UpstreamClient()
            assert await read_all(client, url) == (200, b"ok")
            (origin,) = client._origins.values()
            origin._idle[0].connect_s = connect_s
            if resent:
                again = await client.post(url, b"{}", {})
                assert again.resent and await again.read(100) == b"ok"
                again.release()
            else:
                with pytest.raises(UpstreamBroken, match="the connection broke"):
                    await client.post(url, b"{}", {})
            await client.close()
        assert len(server.bodies) == 2 + resent
    asyncio.run(main())
