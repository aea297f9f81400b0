"""The Kubernetes source's watch uses the source's own API client: it builds none of its
own (each loaded an SSL context from the system's CA store, ~20 ms with the event loop
blocked, at the first watch and again after every 401). The real kubernetes_asyncio
client against the stand-in API server (tests.support.fake_kube_api)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from kubernetes_asyncio.client import rest as k8s_rest

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
from tests.support.loop_check import LoopNoting
from tests.support.waiting import wait_until_async


async def test_a_watch_builds_no_client_of_its_own(
        serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeKubeAPI()
    server = serve(api.app())
    contexts = LoopNoting(ssl, "create_default_context")  # one per client built
    monkeypatch.setattr(k8s_rest, "ssl", contexts)
    source = KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http",
        kubeconfig=write_kubeconfig(tmp_path, server.url, "llm"), retry_s=0.05,
        resync_s=3600))
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: published and api.watching(), 10, "a watch")
        api.put(endpoint_slice("llm", "s", "vllm", 8000, [endpoint("10.0.0.1", "vllm-a")]))
        await wait_until_async(lambda: "vllm-a" in published[-1], 10, "vllm-a, watched")
        api.end_watches()  # the next watch: the same client
        await wait_until_async(lambda: len(api.watch_requests()) >= 2, 10, "a second watch")
        api.put(endpoint_slice("llm", "s", "vllm", 8000, [endpoint("10.0.0.2", "vllm-b")]))
        await wait_until_async(lambda: "vllm-b" in published[-1], 10, "vllm-b, watched")
    assert len(contexts.on_loop) == 1  # the source's client's, none for its watches
