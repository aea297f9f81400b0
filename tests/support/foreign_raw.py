"""A replica that writes its answers byte for byte (status line, headers, body), as servers
the gateway did not write may: HTTP/1.0, no length, a connection closed mid-body.

``raw_replica(answer)`` serves on a loopback port from a background thread: /health,
/v1/models (model ``m``) and an empty /metrics as vLLM answers them, and every other
request with ``answer()``'s bytes, after which it closes the connection.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_MODELS = json.dumps({"object": "list", "data": [
    {"id": "m", "object": "model", "root": "m", "parent": None, "max_model_len": 4096}]}
).encode()
_OWN = {
    "/health": b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    "/v1/models": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(_MODELS), _MODELS),
    "/metrics": b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 0\r\n\r\n",
}


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 answer: Callable[[], bytes], open_: set[asyncio.StreamWriter]) -> None:
    open_.add(writer)
    try:
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            lines = head.split("\r\n")
            path = lines[0].split(" ")[1]
            length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                           if line.lower().startswith("content-length:")), 0)
            await reader.readexactly(length)
            own = _OWN.get(path)
            writer.write(own if own is not None else answer())
            await writer.drain()
            if own is None:
                break
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        open_.discard(writer)
        writer.close()


@contextmanager
def raw_replica(answer: Callable[[], bytes]) -> Iterator[str]:
    """The replica's base URL while the block runs; stopped after it."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    url: list[str] = []
    open_: set[asyncio.StreamWriter] = set()

    async def main() -> asyncio.Server:
        server = await asyncio.start_server(lambda r, w: _serve(r, w, answer, open_),
                                            "127.0.0.1", 0)
        url.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        return server

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(main())
        started.set()
        loop.run_forever()
        server.close()
        for writer in list(open_):
            writer.close()
        loop.run_until_complete(server.wait_closed())
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield url[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
