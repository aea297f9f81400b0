"""Kubernetes discovery: the real kubernetes_asyncio client, inside a real gateway, against
a stand-in API server that speaks the real list/watch JSON (tests.support.fake_kube_api),
with real replicas behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from starlette.responses import Response

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.kube_source import KubernetesSource
from gateway.discovery.targets import Targets
from gateway.state import GatewayState, build_state
from tests.support.fake_kube_api import FakeKubeAPI, endpoint, endpoint_slice, kubeconfig
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until, wait_until_async

Serve = Callable[..., ThreadServer]
ADMIN = {"authorization": "Bearer admin-token-0123456789"}
# in the kubeconfig context's namespace; its port and kubeconfig tell it from another
# cluster's service of that name
SOURCE = "kubernetes:service=vllm port_name=http kubeconfig={}/kubeconfig.yaml"


def start_gateway(serve: Serve, api: ThreadServer, tmp_path: Path, **source: Any
                  ) -> tuple[ThreadServer, GatewayState]:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(kubeconfig(api.url, namespace="llm")))
    config = parse_config({
        "policy": {"name": "round_robin"},
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "failures_to_eject": 1},
        "scrape": {"enabled": False},
        "admin": {"token": ADMIN["authorization"][7:]},
        "discovery": [{"type": "kubernetes", "kubeconfig": str(path), "retry_s": 0.05,
                       "resync_s": 3600, **source}],
    })
    state = build_state(config)
    return serve(create_app(config, state), side=create_admin_app(state)), state


def members(gateway: ThreadServer) -> dict[str, dict[str, Any]]:
    replicas = httpx.get(f"{gateway.side_url}/admin/replicas", headers=ADMIN).json()
    return {r["id"]: r for r in replicas["replicas"]}


def converges(gateway: ThreadServer, ids: set[str], what: str) -> dict[str, dict[str, Any]]:
    def found() -> dict[str, dict[str, Any]] | None:
        now = members(gateway)
        return now if set(now) == ids else None

    return wait_until(found, 15, what)


def metric(gateway: ThreadServer, series: str) -> float:
    for line in httpx.get(f"{gateway.url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not on /metrics")


def test_endpoint_slices_list_watch_bookmarks_gone_and_a_dropped_watch(
        serve: Serve, tmp_path: Path) -> None:
    api = FakeKubeAPI()
    api_server = serve(api.app())
    names = ("vllm-a", "vllm-b", "vllm-c")
    behaviours = {n: Behaviour(n) for n in names}
    urls = {n: serve(fake_replica(b)) for n, b in behaviours.items()}

    def put(pod: str, **conditions: bool | None) -> int:
        return api.put(endpoint_slice("llm", f"{pod}-slice", "vllm", urls[pod].port,
                                      [endpoint("127.0.0.1", pod, **conditions)],
                                      extra_ports={"kv-events": 5557}))

    put("vllm-a")
    put("vllm-b", ready=None)  # ready unset: the API says ready
    put("vllm-c", ready=False)
    api.put(endpoint_slice("llm", "other-slice", "other", urls["vllm-c"].port,
                           [endpoint("127.0.0.1", "other-0")]))  # another Service's
    gateway, state = start_gateway(serve, api_server, tmp_path, service="vllm",
                                   port_name="http")
    found = converges(gateway, {"vllm-a", "vllm-b"}, "the two ready endpoints")
    source = SOURCE.format(tmp_path)
    assert {r["source"] for r in found.values()} == {source}
    assert found["vllm-a"]["url"] == urls["vllm-a"].url
    replica = state.fleet.get("vllm-a")
    assert replica is not None and replica.config.kv_events == "tcp://127.0.0.1:5557"
    listed = api.list_requests()[0]
    assert listed["labelSelector"] == "kubernetes.io/service-name=vllm"
    first_watch = wait_until(api.watch_requests, 5, "a watch")[0]
    assert first_watch["allowWatchBookmarks"] == "true"
    assert first_watch["resourceVersion"] == str(api.rv)

    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    answered = {client.completions.with_raw_response.create(
        model="sim-model", prompt="hi", max_tokens=2).headers["x-kvgate-replica"]
        for _ in range(4)}
    assert answered == {"vllm-a", "vllm-b"}

    put("vllm-c", ready=True)  # a watch event: joins
    converges(gateway, {"vllm-a", "vllm-b", "vllm-c"}, "vllm-c to join when ready")

    # a bookmark moves the resourceVersion on; a watch the server ends resumes there
    lists = len(api.list_requests())
    wait_until(api.watching, 5, "the watch")
    bookmark = api.bookmark()
    api.end_watches()
    wait_until(lambda: any(w["resourceVersion"] == str(bookmark)
                           for w in api.watch_requests()), 10,
               "a watch resumed from the bookmark's resourceVersion")
    assert len(api.list_requests()) == lists  # a clean end needs no list

    # the watch breaks and the API is down while vllm-b's pod is deleted; its event is
    # compacted away before the client is back: the list must remove it
    api.down()
    refused = len(api.requests)
    api.drop_watches()
    api.delete("llm", "vllm-b-slice")
    api.compact()
    wait_until(lambda: len(api.requests) >= refused + 2, 10, "the client to retry")
    api.down(False)
    converges(gateway, {"vllm-a", "vllm-c"}, "vllm-b, deleted during the outage, removed")
    assert metric(gateway, f'kvgate_discovery_failures_total{{source="{source}"}}') >= 1
    before = len(behaviours["vllm-b"].received)
    answered = {client.completions.with_raw_response.create(
        model="sim-model", prompt="hi", max_tokens=2).headers["x-kvgate-replica"]
        for _ in range(4)}
    assert answered == {"vllm-a", "vllm-c"}
    assert len(behaviours["vllm-b"].received) == before

    # a watch gone silently stale misses vllm-c turning unready; history is compacted, so
    # the next watch is answered 410 Gone, and the list that follows catches up
    wait_until(api.watching, 10, "a watch again")
    api.bookmark()  # the watch got an event: its end is no short watch (a failure)
    api.deaf()
    put("vllm-c", ready=False, serving=True, terminating=True)
    api.compact()
    api.deaf(False)
    api.end_watches()
    converges(gateway, {"vllm-a"}, "vllm-c removed after 410 Gone and a new list")
    assert metric(gateway, f'kvgate_discovery_watch_gone_total{{source="{source}"}}') >= 1
    assert metric(gateway, f'kvgate_discovery_replicas{{source="{source}"}}') == 1

    # no endpoint ready: the serving ones that are terminating take the traffic
    wait_until(api.watching, 10, "a watch again")
    put("vllm-a", ready=False, serving=True, terminating=True)
    converges(gateway, {"vllm-a", "vllm-c"}, "serving terminating endpoints as fallback")


def pod(name: str, port: int, ready: bool = True, kv_events: str | None = None,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "llm", "labels": {"app": "vllm"}}
    if kv_events is not None:
        meta["annotations"] = {"kvgate.io/kv-events-port": kv_events}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return {"metadata": meta,
            "spec": {"containers": [{"name": "engine", "ports": [
                {"name": "http", "containerPort": port, "protocol": "TCP"},
                {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pods_by_label_selector(serve: Serve, tmp_path: Path) -> None:
    api = FakeKubeAPI("Pod")
    api_server = serve(api.app())
    a, b = serve(fake_replica(Behaviour("a"))), serve(fake_replica(Behaviour("b")))
    api.put(pod("vllm-0", a.port, kv_events="5600"))
    api.put(pod("vllm-1", b.port, ready=False))
    api.put(pod("vllm-2", b.port, deleting=True))
    gateway, state = start_gateway(serve, api_server, tmp_path, label_selector="app=vllm",
                                   port_name="http")
    converges(gateway, {"vllm-0"}, "the one ready pod")
    assert api.list_requests()[0]["labelSelector"] == "app=vllm"
    assert set(api.authorizations) == {"Bearer test-token"}  # the kubeconfig's user
    replica = state.fleet.get("vllm-0")
    assert replica is not None and replica.config.kv_events == "tcp://127.0.0.1:5600"
    api.put(pod("vllm-1", b.port))
    converges(gateway, {"vllm-0", "vllm-1"}, "vllm-1 to join when ready")
    api.delete("llm", "vllm-0")
    found = converges(gateway, {"vllm-1"}, "vllm-0 to leave when deleted")
    assert found["vllm-1"]["url"] == b.url
    # the gateway's shutdown stops discovery: its watch is closed
    wait_until(lambda: api.watching() == 1, 5, "one watch")
    gateway.stop()
    assert not gateway.thread.is_alive()
    wait_until(lambda: api.watching() == 0, 5, "the watch to close")


class EndsWatchesAtOnce(FakeKubeAPI):
    """Ends every watch as soon as it is asked for, with no event (a proxy in front of the
    API server that does not stream, a server shutting down behind a balancer)."""

    def _watch(self, query: dict[str, str], matches: Callable[[dict[str, Any]], bool]
               ) -> Response:
        return Response(b"", media_type="application/json")


def kube_source(api: ThreadServer, tmp_path: Path) -> KubernetesSource:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(kubeconfig(api.url, namespace="llm")))
    return KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http", kubeconfig=str(path), retry_s=0.05,
        resync_s=3600))


async def running(source: KubernetesSource, until: Callable[[], object], what: str) -> None:
    async def publish(targets: Targets) -> None:
        return None

    task = asyncio.create_task(source.run(publish))
    try:
        await wait_until_async(until, 10, what)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.close()


async def test_a_watch_ended_at_once_is_a_failure_not_a_reason_to_watch_again_at_once(
        serve: Serve, tmp_path: Path) -> None:
    api = EndsWatchesAtOnce()
    server = serve(api.app())
    api.put(endpoint_slice("llm", "s", "vllm", 8000, [endpoint("10.0.0.1", "vllm-a")]))
    source = kube_source(server, tmp_path)
    # watched again as fast as the server answered, dozens of times a second; now each
    # such end counts as a failure and is followed by the back-off and a fresh list
    await running(source, lambda: source.stats.failures >= 3, "short watches as failures")
    assert len(api.watch_requests()) <= source.stats.failures + 1
    assert source.stats.relists >= source.stats.failures



async def test_a_refused_list_is_named_by_the_apis_answer(serve: Serve, tmp_path: Path
                                                         ) -> None:
    api = FakeKubeAPI()
    server = serve(api.app())
    api.down()  # every request answered 503 with a Status, as a 403 (no RBAC) would be
    source = kube_source(server, tmp_path)
    await running(source, lambda: source.stats.failures >= 1, "a failed list")
    assert source.stats.last_error == \
        "API answered 503: ServiceUnavailable: down for the test"
    assert source.stats.relists == 0
