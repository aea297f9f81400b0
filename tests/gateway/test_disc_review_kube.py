"""Kubernetes discovery's client: credentials that change under it, and what each watch
costs the event loop. The real kubernetes_asyncio client against the stand-in API server
(tests.support.fake_kube_api)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.kube_source import KubernetesSource
from gateway.discovery.targets import Targets
from tests.support.fake_kube_api import (
    FakeKubeAPI,
    endpoint,
    endpoint_slice,
    source_running,
    write_kubeconfig,
)
from tests.support.gateway_harness import Serve
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until_async


class OneToken(FakeKubeAPI):
    """Answers 401 (a Status, as the API server does) to a request without ``token``."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self.token = token

    async def _endpoint(self, request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {self.token}":
            self.requests.append(dict(request.query_params))
            return JSONResponse({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                 "status": "Failure", "message": "Unauthorized",
                                 "reason": "Unauthorized", "code": 401}, status_code=401)
        return await super()._endpoint(request)


def source_for(api: ThreadServer, tmp_path: Path, user: dict[str, Any]) -> KubernetesSource:
    path = write_kubeconfig(tmp_path, api.url, "llm", users=[{"name": "test", "user": user}])
    return KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http", kubeconfig=path, retry_s=0.05, resync_s=3600))


async def test_credentials_that_expired_are_loaded_again(serve: Serve, tmp_path: Path
                                                         ) -> None:
    # a kubeconfig's credentials (an exec plugin's token, a tokenFile) were read once, when
    # the client was built: once they expired, every list and watch was answered 401 for
    # as long as the gateway ran, and the fleet stayed as it was at that moment
    api = OneToken("first")
    server = serve(api.app())
    api.put(endpoint_slice("llm", "s", "vllm", 8000, [endpoint("10.0.0.1", "vllm-a")]))
    token = tmp_path / "token"
    token.write_text("first")
    source = source_for(server, tmp_path, {"tokenFile": str(token)})
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: published and api.watching(), 10, "a list and a watch")
        token.write_text("second")  # the credentials rotate; the old token is refused
        api.token = "second"
        api.put(endpoint_slice("llm", "s2", "vllm", 8000, [endpoint("10.0.0.2", "vllm-b")]))
        await wait_until_async(lambda: "vllm-b" in published[-1], 10, "vllm-b")
        api.end_watches()  # the next watch carries the old token
        await wait_until_async(lambda: source.stats.failures, 10, "a 401")
        assert source.stats.last_error is not None and "401" in source.stats.last_error
        await wait_until_async(lambda: api.watching() and source.stats.last_error is None,
                               10, "a watch with the new token")
        assert source.stats.relists == 2


async def test_a_watch_loads_no_ssl_context_on_the_event_loop(
        serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # each watch built the client library's Watch, and with it an ApiClient of its own:
    # an SSL context loaded from disk, ~20 ms with the event loop blocked, every minute
    api = FakeKubeAPI()
    server = serve(api.app())
    api.put(endpoint_slice("llm", "s", "vllm", 8000, [endpoint("10.0.0.1", "vllm-a")]))
    source = source_for(server, tmp_path, {"token": "test-token"})
    loaded: list[object] = []
    real = ssl.create_default_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        loaded.append(args)
        return real(*args, **kwargs)

    async with source_running(source, []):
        await wait_until_async(api.watching, 10, "a first watch")
        monkeypatch.setattr(ssl, "create_default_context", counted)
        for n in range(2, 5):
            api.bookmark()  # the watch got an event: its end is no failure
            api.end_watches()
            await wait_until_async(lambda n=n: len(api.watch_requests()) >= n and api.watching(),
                                   10, f"watch {n}")
        assert source.stats.failures == 0 and source.stats.relists == 1
        assert loaded == []
