"""Kubernetes discovery reads the operator's kubeconfig and never writes it: a token its
auth provider refreshes stays in the gateway's memory. The real kubernetes_asyncio client
against the stand-in API server and a stand-in OIDC issuer."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

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
from tests.support.waiting import wait_until_async


def issuer() -> tuple[Starlette, list[str]]:
    """An OIDC issuer that refreshes any refresh token; the grants it was asked for."""
    asked: list[str] = []

    async def well_known(request: Request) -> JSONResponse:
        return JSONResponse({"token_endpoint": f"{request.base_url}token"})

    async def token(request: Request) -> JSONResponse:
        asked.extend(parse_qs((await request.body()).decode())["grant_type"])
        return JSONResponse({"id_token": "h.e.s", "refresh_token": "refresh-2"})

    return Starlette(routes=[Route("/.well-known/openid-configuration", well_known),
                             Route("/token", token, methods=["POST"])]), asked


def annotated_kubeconfig(directory: Path, server: str, user: dict[str, Any]
                         ) -> tuple[Path, bytes]:
    """A kubeconfig for ``server`` as ``user``, with a comment of the operator's; its
    path and its bytes."""
    path = Path(write_kubeconfig(directory, server, "llm",
                                 users=[{"name": "test", "user": user}]))
    path.write_text("# the operator's own notes\n" + path.read_text())
    return path, path.read_bytes()


# the client library's OIDC refresh uses aiohttp's deprecated arguments (BasicAuth,
# verify_ssl, ssl_context): those warnings are the library's, not the gateway's
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_a_refreshed_token_is_not_written_to_the_operators_kubeconfig(
        serve: Serve, tmp_path: Path) -> None:
    # the client library's default persists it, through a persister that takes no
    # argument: every client build failed with a TypeError, and discovery stayed down for
    # good with an OIDC (or GCP) kubeconfig whose token was missing or expired; had the
    # write worked, it would have rewritten the file (its comments lost), or failed where
    # it cannot be written (a mounted Secret)
    api = FakeKubeAPI()
    server = serve(api.app())
    app, asked = issuer()
    oidc = serve(app)
    api.put(endpoint_slice("llm", "s", "vllm", 8000, [endpoint("10.0.0.1", "vllm-a")]))
    user = {"auth-provider": {"name": "oidc", "config": {
        "client-id": "kvgate", "client-secret": "s", "idp-issuer-url": oidc.url,
        "refresh-token": "refresh-1"}}}  # no id-token yet: refreshed at the first build
    path, written = annotated_kubeconfig(tmp_path, server.url, user)
    source = KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http", kubeconfig=str(path), retry_s=0.05,
        resync_s=3600))
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: published or source.stats.failures, 10,
                               "a list, or a failure")
    assert source.stats.last_error is None and list(published[0]) == ["vllm-a"]
    assert asked == ["refresh_token"]  # the token was refreshed ...
    assert path.read_bytes() == written  # ... and the file left as the operator wrote it
