"""Forward a request to the ranked replicas and relay the answer byte for byte.

``Proxy.open`` tries the decision's replicas in order until one answers with a first
response byte: a connect error ejects the replica and moves on; a 5xx before the first
byte moves on; a 4xx is the client's problem and is relayed as it is. ``UpstreamStream``
then yields the body as it arrives (no buffering), enforcing the idle timeout between
chunks, and settles the accounting exactly once however the stream ends (finished,
failed, or cancelled by a client disconnect, which closes the upstream connection).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from gateway.config import TimeoutConfig
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.fleet import Fleet, Pending
from gateway.metrics import GatewayMetrics
from kvwire.openai_schema import OpenAIError

log = logging.getLogger("kvgate.proxy")

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
_USAGE_CAPTURE_LIMIT = 1 << 20  # bytes of a non-streamed body kept to read its usage
_SSE_TAIL = 8192  # bytes of a stream kept: its last event carries the usage


_SERVER_OWN = _HOP_BY_HOP | {"date", "server"}  # the gateway's server writes its own


def forward_headers(headers: Mapping[str, str], skip: frozenset[str] = _HOP_BY_HOP
                    ) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in skip}


@dataclass(slots=True)
class Attempted:
    replica: str
    cause: str


class UpstreamStream:
    """An open upstream response whose first chunk has arrived."""

    def __init__(self, replica: str, response: aiohttp.ClientResponse, first_chunk: bytes,
                 pending: Pending, idle_s: float, fleet: Fleet,
                 on_done: Callable[[UpstreamStream, bool], None], first_byte_s: float = 0.0
                 ) -> None:
        self.replica = replica
        self.first_byte_s = first_byte_s  # from sending to the first body byte
        self._opened = time.perf_counter() - first_byte_s
        self.duration_s: float | None = None  # from sending to the last byte, once closed
        self.response = response
        self.status = response.status
        self.headers = forward_headers(response.headers, _SERVER_OWN)
        self.first_chunk = first_chunk
        self.pending = pending
        self.idle_s = idle_s
        self.fleet = fleet
        self.on_done = on_done
        self.stream = "text/event-stream" in response.headers.get("content-type", "")
        # what usage() reads: a stream's last bytes, or a body's chunks (up to a limit)
        self._tail = first_chunk[-_SSE_TAIL:] if self.stream else b""
        self._body = [] if self.stream else [first_chunk]
        self._body_bytes = len(first_chunk)
        self._closed = False

    @property
    def complete(self) -> bool:
        """True when the first chunk was the whole body (a small non-streamed answer)."""
        return self.response.content.is_eof() and not self.stream

    def whole_body(self) -> bytes:
        """The body of a ``complete`` response; settles the accounting."""
        assert self.complete
        self.close(True)
        return self.first_chunk

    async def relay(self) -> AsyncIterator[bytes]:
        ok = False
        try:
            if self.first_chunk:
                yield self.first_chunk
            content = self.response.content
            while True:
                async with asyncio.timeout(self.idle_s):
                    chunk = await content.readany()
                if not chunk:
                    break
                if self.stream:
                    self._tail = (self._tail + chunk)[-_SSE_TAIL:]  # usage is in the tail
                elif self._body_bytes < _USAGE_CAPTURE_LIMIT:
                    self._body.append(chunk)
                    self._body_bytes += len(chunk)
                yield chunk
            ok = True
        except TimeoutError:
            log.warning("replica %s idle for over %s s: closing the stream", self.replica,
                        self.idle_s)
        except aiohttp.ClientError as exc:
            log.warning("replica %s broke the stream: %s", self.replica, exc)
        finally:
            self.close(ok)

    def close(self, ok: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self.duration_s = time.perf_counter() - self._opened
        if ok:
            self.response.release()
        else:
            self.response.close()  # drops the connection: the replica sees the cancel
        self.fleet.done(self.pending)
        self.on_done(self, ok and self.status < 400)

    def usage(self) -> tuple[int, int] | None:
        """(prompt tokens, cached prompt tokens) from the body's ``usage``, if reported."""
        text = self._tail if self.stream else b"".join(self._body)
        if self.stream:
            idx = text.rfind(b'"usage"')
            if idx < 0:
                return None
            start = text.rfind(b"data: ", 0, idx)
            end = text.find(b"\n", idx)
            text = text[start + 6 if start >= 0 else 0:end if end >= 0 else len(text)]
        try:
            usage = orjson.loads(text).get("usage") or {}
            prompt = usage.get("prompt_tokens")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        except (ValueError, AttributeError):
            return None
        if isinstance(prompt, int) and isinstance(cached, int):
            return prompt, cached
        return None


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, fleet: Fleet, timeouts: TimeoutConfig,
                 metrics: GatewayMetrics, max_attempts: int) -> None:
        self.session = session
        self.fleet = fleet
        self.timeouts = timeouts
        self.metrics = metrics
        self.max_attempts = max_attempts

    async def open(self, ranked: Sequence[str], path: str, body: bytes,
                   headers: Mapping[str, str], work_tokens: Callable[[str], int],
                   on_sent: Callable[[str], None],
                   on_done: Callable[[UpstreamStream, bool], None]) -> UpstreamStream:
        """Send to ``ranked`` in order until one answers; raise if none does.
        ``work_tokens(replica)``: the prompt tokens that replica must prefill, counted as
        its pending work until the first byte."""
        attempts: list[Attempted] = []
        last_error: OpenAIError | None = None
        for replica in ranked[: self.max_attempts]:
            state = self.fleet.get(replica)
            if state is None or (not state.healthy and attempts):
                continue
            on_sent(replica)
            pending = self.fleet.sent(replica, work_tokens(replica))
            started = time.perf_counter()
            response: aiohttp.ClientResponse | None = None
            try:
                async with asyncio.timeout(self.timeouts.first_byte_s):
                    response = await self.session.post(
                        f"{state.config.base_url}{path}", data=body, headers=headers)
                    if response.status >= 500:
                        detail = (await response.read())[:200].decode(errors="replace")
                        response.release()
                        raise _Retryable(f"answered {response.status}: {detail}")
                    first = await response.content.readany()
            except aiohttp.ClientError as exc:  # refused, reset, or a malformed answer
                self._failed(pending, response)
                cause = "connect" if isinstance(exc, aiohttp.ClientConnectorError) else "broken"
                if cause == "connect" and self.fleet.eject(replica, str(exc)):
                    log.warning("replica %s ejected: %s", replica, exc)
                attempts.append(Attempted(replica, cause))
                last_error = UpstreamError(f"replica {replica!r} failed: {exc}",
                                           code="upstream_unreachable")
                continue
            except _Retryable as exc:
                self._failed(pending, response)
                attempts.append(Attempted(replica, "5xx"))
                last_error = UpstreamError(f"replica {replica!r} {exc}", code="upstream_error")
                continue
            except TimeoutError:
                self._failed(pending, response)
                raise UpstreamTimeout(
                    f"replica {replica!r} sent no byte within {self.timeouts.first_byte_s} s",
                    code="upstream_timeout") from None
            except BaseException:  # cancelled by a client disconnect: close the upstream
                self._failed(pending, response)
                raise
            self.fleet.first_byte(pending)
            first_byte_s = time.perf_counter() - started
            self.metrics.upstream_ttfb.labels(replica=replica).observe(first_byte_s)
            for attempt in attempts:
                self.metrics.retries.labels(replica=attempt.replica, cause=attempt.cause).inc()
            return UpstreamStream(replica, response, first, pending, self.timeouts.idle_s,
                                  self.fleet, on_done, first_byte_s)
        if last_error is None:
            last_error = UpstreamError("no replica could be tried", code="upstream_error")
        raise last_error

    def _failed(self, pending: Pending, response: aiohttp.ClientResponse | None) -> None:
        if response is not None:
            response.close()
        self.fleet.done(pending)


class _Retryable(Exception):
    pass
