"""Kubernetes discovery's work on the event loop, with thousands of objects: the
kubeconfig read off the loop, each watch event decoded once and worked out alone, a list's
objects turned into replicas with the loop handed back. The real kubernetes_asyncio client
against the stand-in API server (tests.support.fake_kube_api)."""

from __future__ import annotations

import builtins
import json
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import api_client as k8s_api_client
from kubernetes_asyncio.config import kube_config as k8s_kube_config
from kubernetes_asyncio.watch import watch as k8s_watch

from gateway import loop_slices
from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.kube_source import KubernetesSource
from gateway.discovery.targets import Targets
from tests.support.fake_kube_api import (
    FakeKubeAPI,
    endpoint,
    endpoint_slice,
    pod_list_turns,
    source_running,
    write_kubeconfig,
)
from tests.support.loop_check import LoopNoting
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until_async

Serve = Callable[..., ThreadServer]


def pod(name: str, ready: bool = True, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "llm",
                         "labels": {"app": "vllm", **labels}},
            "spec": {"containers": [{"name": "engine", "ports": [
                {"name": "http", "containerPort": 8000, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}}


class ThreadNoting:
    """``inner``'s attribute ``name``, noting the thread of each call (``threads``)."""

    def __init__(self, inner: Any, name: str) -> None:
        self.threads: list[int] = []
        self._call = getattr(inner, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        return self._call(*args, **kwargs)


async def test_the_kubeconfig_and_its_token_file_are_read_off_the_loop(
        serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # load_kube_config is async, but opened, read and parsed the kubeconfig's YAML (and
    # read its token file) synchronously, with the event loop blocked all along; the
    # namespace was then found by parsing the file a second time
    api = FakeKubeAPI()
    server = serve(api.app())
    api.put(endpoint_slice("other", "s", "vllm", 8000, [endpoint("10.0.0.1", "vllm-a")]))
    token = tmp_path / "token"
    token.write_text("from-file")
    path = write_kubeconfig(
        tmp_path, server.url, "llm", users=[{"name": "test", "user": {"tokenFile": str(token)}}],
        contexts=[{"name": "test", "context": {"cluster": "test", "user": "test",
                                               "namespace": "llm"}},
                  {"name": "second", "context": {"cluster": "test", "user": "test",
                                                 "namespace": "other"}}])
    # the loader runs on an event loop of its own: which thread ran it tells it from ours
    parses = ThreadNoting(yaml, "safe_load")
    files = ThreadNoting(builtins, "open")
    monkeypatch.setattr(k8s_kube_config, "yaml",
                        SimpleNamespace(safe_load=parses, safe_dump=yaml.safe_dump))
    monkeypatch.setattr(k8s_kube_config, "open", files, raising=False)
    source = KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http", kubeconfig=path, context="second",
        retry_s=0.05, resync_s=3600))
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: published and "vllm-a" in published[-1], 10,
                               "vllm-a, in the chosen context's namespace")
    assert set(api.authorizations) == {"Bearer from-file"}
    ours = threading.get_ident()
    assert parses.threads and ours not in parses.threads
    assert len(parses.threads) == 1  # and once: the namespace is the loader's context's
    assert files.threads and ours not in files.threads


async def test_a_watch_event_is_decoded_once(serve: Serve, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # the client decoded each line, encoded its object again and decoded that once more
    # (to build a model of it, here the dict itself): three passes over every event
    api = FakeKubeAPI()
    server = serve(api.app())
    source = KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http",
        kubeconfig=write_kubeconfig(tmp_path, server.url, "llm"), retry_s=0.05, resync_s=3600))
    codec = LoopNoting(json, "loads", "dumps")  # every decode and encode of the client
    monkeypatch.setattr(k8s_watch, "json", codec)
    monkeypatch.setattr(k8s_api_client, "json", codec)
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: published and api.watching(), 10, "a watch")
        before = len(codec.on_loop)
        names = [f"vllm-{i}" for i in range(5)]
        for i, name in enumerate(names):
            api.put(endpoint_slice("llm", f"s{i}", "vllm", 8000,
                                   [endpoint(f"10.0.0.{i + 1}", name)]))
        await wait_until_async(lambda: set(published[-1]) == set(names), 10,
                               "the five slices' events")
        assert source.events == len(names)
        assert len(codec.on_loop) - before == len(names)


async def test_a_watch_event_works_out_only_the_pod_it_names(
        serve: Serve, tmp_path: Path) -> None:
    # every event built the replica of every pod again (~30 ms for 4,000 pods) and
    # published the whole set, even when what changed (a label, the status of a pod
    # still ready) changed no replica
    api = FakeKubeAPI("Pod")
    server = serve(api.app())
    names = {f"vllm-{i:02d}" for i in range(50)}
    for name in names:
        api.put(pod(name))
    source = KubernetesSource(KubernetesSourceConfig(
        label_selector="app=vllm", port_name="http",
        kubeconfig=write_kubeconfig(tmp_path, server.url, "llm"), retry_s=0.05, resync_s=3600))
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: published and api.watching(), 10, "a list and a watch")
        first = published[-1]
        assert set(first) == names
        api.put(pod("vllm-00", ready=False))
        await wait_until_async(lambda: "vllm-00" not in published[-1], 10, "vllm-00 to leave")
        after = published[-1]
        assert set(after) == names - {"vllm-00"}
        assert all(after[name] is first[name] for name in after)  # none built again
        sent, events = len(published), source.events
        api.put(pod("vllm-01", team="a"))  # no replica changes
        await wait_until_async(lambda: source.events > events, 10, "the label's event")
        api.put(pod("vllm-00"))
        await wait_until_async(lambda: "vllm-00" in published[-1], 10, "vllm-00 back")
        assert len(published) == sent + 1  # the label's event published nothing
        # ... and left vllm-01's config the one membership was handed (it passes over
        # a config handed again as the same object)
        assert published[-1]["vllm-01"] is first["vllm-01"]


async def test_listed_pods_become_replicas_with_the_loop_handed_back(
        serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a list's pods (thousands) were kept as JSON and turned into replicas all at once on
    # the loop when the set was published (~30 ms for 4,000); now each page's pods are
    # turned into replicas as they are taken from the page, the loop handed back between
    monkeypatch.setattr(loop_slices, "SLICE_S", 0.0)  # hand back after every item
    api = FakeKubeAPI("Pod")
    server = serve(api.app())
    names = {f"vllm-{i:03d}" for i in range(200)}
    for name in names:
        api.put(pod(name))
    path = write_kubeconfig(tmp_path, server.url, "llm")
    source = KubernetesSource(KubernetesSourceConfig(
        namespace="llm", label_selector="app=vllm", port_name="http", kubeconfig=path))
    _, ran = await pod_list_turns(source, path)
    found = source.targets()
    assert set(found) == names
    # once an item while decoding the page, and once again while making replicas of it
    assert ran >= 2 * len(names) - 2, f"the loop ran {ran} times for {len(names)} pods"
