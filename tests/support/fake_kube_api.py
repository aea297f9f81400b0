"""A stand-in for the Kubernetes API server: the list and watch endpoints of one kind
(EndpointSlices of discovery.k8s.io/v1, or v1 Pods), speaking the real JSON, for tests
that drive a real client library against it.

What a test can make it do, from its own thread (each call runs on the server's loop):
``put``/``delete`` objects (each change a new resourceVersion, sent to open watches as
ADDED / MODIFIED / DELETED), ``bookmark`` (a BOOKMARK event at a newer resourceVersion),
``compact`` (history before now forgotten: a watch from an older version gets an ERROR
event with a 410 Gone Status), ``end_watches`` (each open watch ends cleanly, as at its
timeoutSeconds), ``drop_watches`` (each open watch's connection breaks mid-stream),
``deaf`` (changes are kept but not sent to open watches: a watch gone silently stale),
and ``down`` (every request answered 503). It records the query of every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.loop_turns import counted_turns

T = TypeVar("T")

BOOLEANS = ("watch", "allowWatchBookmarks")
_END = object()  # a watch's queue: end the stream cleanly
_BREAK = object()  # ... break its connection


class WatchBroken(Exception):
    """Raised inside a watch's response body: the server drops the connection."""


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeKubeAPI:
    def __init__(self, kind: str = "EndpointSlice") -> None:
        if kind == "EndpointSlice":
            self.api_version, self.path = "discovery.k8s.io/v1", \
                "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        else:
            self.api_version, self.path = "v1", "/api/v1/namespaces/{namespace}/pods"
        self.kind = kind
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> obj
        self.rv = 1000
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (rv, type, object)
        self.oldest = 0  # a watch from a version below this one is answered 410
        self.requests: list[dict[str, str]] = []  # query of each request, in order
        self.authorizations: list[str] = []  # Authorization header of each request
        self.is_down = False
        self.is_deaf = False
        self._watches: list[tuple[asyncio.Queue[Any], str, Callable[[dict[str, Any]], bool]]] \
            = []
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the test's side (from any thread) -------------------------------------------------
    def _on_loop(self, fn: Callable[[], T]) -> T:
        assert self._loop is not None, "the fake API server is not started"

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def put(self, obj: dict[str, Any]) -> int:
        """Create or replace ``obj`` (metadata.name and metadata.namespace set); its new
        resourceVersion."""
        return self._on_loop(lambda: self._change(obj))

    def delete(self, namespace: str, name: str) -> int:
        return self._on_loop(lambda: self._change(None, (namespace, name)))

    def bookmark(self) -> int:
        """Send open watches that asked for bookmarks a BOOKMARK at a new version."""
        def run() -> int:
            self.rv += 1
            event = {"type": "BOOKMARK", "object": {
                "kind": self.kind, "apiVersion": self.api_version,
                "metadata": {"resourceVersion": str(self.rv)}}}
            for queue, bookmarks, _ in self._watches:
                if bookmarks == "true":
                    queue.put_nowait(event)
            return self.rv
        return self._on_loop(run)

    def compact(self) -> None:
        def run() -> None:
            self.history.clear()
            self.oldest = self.rv + 1
        self._on_loop(run)

    def end_watches(self) -> None:
        self._on_loop(lambda: self._tell_watches(_END))

    def drop_watches(self) -> None:
        self._on_loop(lambda: self._tell_watches(_BREAK))

    def down(self, down: bool = True) -> None:
        self.is_down = down

    def deaf(self, deaf: bool = True) -> None:
        self.is_deaf = deaf

    def watching(self) -> int:
        """Watches open now."""
        return len(self._watches)

    def watch_requests(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") == "true"]

    def list_requests(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") != "true"]

    # -- on the server's loop --------------------------------------------------------------
    def _tell_watches(self, what: object) -> None:
        for queue, _, _ in self._watches:
            queue.put_nowait(what)

    def _change(self, obj: dict[str, Any] | None, key: tuple[str, str] | None = None) -> int:
        self.rv += 1
        if obj is not None:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            key = (meta["namespace"], meta["name"])
            kind = "MODIFIED" if key in self.objects else "ADDED"
            obj.update(kind=self.kind, apiVersion=self.api_version)
            meta["resourceVersion"] = str(self.rv)
            self.objects[key] = obj
        else:
            assert key is not None
            obj = copy.deepcopy(self.objects.pop(key))
            obj["metadata"]["resourceVersion"] = str(self.rv)
            kind = "DELETED"
        self.history.append((self.rv, kind, obj))
        if not self.is_deaf:
            for queue, _, matches in self._watches:
                if matches(obj):
                    queue.put_nowait({"type": kind, "object": obj})
        return self.rv

    def _selector(self, namespace: str, query: dict[str, str]
                  ) -> Callable[[dict[str, Any]], bool]:
        """Equality-based label selectors (``a=b,c=d``), which is all discovery sends."""
        wanted = dict(part.split("=", 1) for part in query.get("labelSelector", "").split(",")
                      if part)

        def matches(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            labels = meta.get("labels") or {}
            return meta["namespace"] == namespace and \
                all(labels.get(k) == v for k, v in wanted.items())

        return matches

    async def _endpoint(self, request: Request) -> Response:
        query = dict(request.query_params)
        for key in BOOLEANS:  # as the API server reads them (Go's ParseBool: True, 1, ...)
            if key in query:
                query[key] = "true" if query[key].lower() in ("true", "t", "1") else "false"
        self.requests.append(query)
        self.authorizations.append(request.headers.get("authorization", ""))
        if self.is_down:
            return JSONResponse(_status(503, "ServiceUnavailable", "down for the test"),
                                status_code=503)
        matches = self._selector(request.path_params["namespace"], query)
        if query.get("watch") == "true":
            return self._watch(query, matches)
        items = [o for o in self.objects.values() if matches(o)]
        return JSONResponse({"kind": f"{self.kind}List", "apiVersion": self.api_version,
                             "metadata": {"resourceVersion": str(self.rv)}, "items": items})

    def _watch(self, query: dict[str, str], matches: Callable[[dict[str, Any]], bool]
               ) -> Response:
        since = int(query.get("resourceVersion") or self.rv)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        if since < self.oldest - 1:
            queue.put_nowait({"type": "ERROR", "object": _status(
                410, "Expired", f"too old resource version: {since} ({self.oldest})")})
            queue.put_nowait(_END)
        else:
            for rv, kind, obj in self.history:
                if rv > since and matches(obj):
                    queue.put_nowait({"type": kind, "object": obj})
        entry = (queue, query.get("allowWatchBookmarks", "false"), matches)
        self._watches.append(entry)

        async def body() -> AsyncIterator[bytes]:
            try:
                while True:
                    item = await queue.get()
                    if item is _END:
                        return
                    if item is _BREAK:
                        raise WatchBroken("connection dropped by the test")
                    yield json.dumps(item).encode() + b"\n"
            finally:
                with contextlib.suppress(ValueError):
                    self._watches.remove(entry)

        return StreamingResponse(body(), media_type="application/json")

    def app(self) -> Starlette:
        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self._loop = asyncio.get_running_loop()
            yield
            self._tell_watches(_END)

        return Starlette(routes=[Route(self.path, self._endpoint, methods=["GET"])],
                         lifespan=lifespan)


def endpoint_slice(namespace: str, name: str, service: str, port: int,
                   endpoints: list[dict[str, Any]], port_name: str = "http",
                   extra_ports: dict[str, int] | None = None) -> dict[str, Any]:
    """An EndpointSlice of ``service`` with one TCP port named ``port_name`` (and
    ``extra_ports``)."""
    ports = [{"name": port_name, "port": port, "protocol": "TCP"}]
    ports += [{"name": n, "port": p, "protocol": "TCP"} for n, p in (extra_ports or {}).items()]
    return {"metadata": {"name": name, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": endpoints, "ports": ports}


def endpoint(address: str, pod: str, ready: bool | None = True, serving: bool | None = None,
             terminating: bool | None = None) -> dict[str, Any]:
    conditions = {k: v for k, v in (("ready", ready), ("serving", serving),
                                    ("terminating", terminating)) if v is not None}
    return {"addresses": [address], "conditions": conditions,
            "targetRef": {"kind": "Pod", "name": pod, "namespace": "llm"}}


def kubeconfig(server: str, namespace: str | None = None) -> dict[str, Any]:
    """A kubeconfig that reaches ``server`` over plain HTTP with a token, its context in
    ``namespace`` when given."""
    context = {"cluster": "test", "user": "test", **({"namespace": namespace} if namespace
                                                    else {})}
    return {"apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": server}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": context}]}


def write_kubeconfig(directory: Path, server: str, namespace: str | None = None,
                     **changes: Any) -> str:
    """``kubeconfig(server, namespace)`` with its top-level keys ``changes`` replaced,
    written to ``directory``/kubeconfig.yaml; that file's path."""
    path = directory / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump({**kubeconfig(server, namespace), **changes}))
    return str(path)


@contextlib.asynccontextmanager
async def source_running(source: Any, published: list[Any]) -> AsyncIterator[None]:
    """``source.run`` (a discovery source) as a task, each set it publishes appended to
    ``published``; on leaving, the task cancelled and the source closed."""

    async def publish(targets: Any) -> None:
        published.append(targets)

    task = asyncio.create_task(source.run(publish))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.close()


async def pod_list_turns(source: Any, kubeconfig_path: str) -> tuple[int, int]:
    """``source.list`` (a ``KubernetesSource`` of pods) over the real client, each page's
    whole answer read before it is handed on, with a coroutine that counts its turns
    meanwhile: (pages listed, the turns it had from the first page's arrival to the end
    of the list, when no more I/O is awaited: only the source's own work)."""
    from kubernetes_asyncio import client as k8s
    from kubernetes_asyncio import config as k8s_config

    api_client = await k8s_config.new_client_from_config(config_file=kubeconfig_path)
    ticks_at: list[int] = []
    try:
        async with counted_turns() as turns:
            async def lister(*args: Any, **kwargs: Any) -> Any:
                resp: Any = await k8s.CoreV1Api(api_client).list_namespaced_pod(*args,
                                                                                **kwargs)
                await resp.read()
                ticks_at.append(turns.count)
                return resp

            await source.list(lister)
            return len(ticks_at), turns.count - ticks_at[0]
    finally:
        await api_client.close()
