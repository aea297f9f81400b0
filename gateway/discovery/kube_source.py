"""Kubernetes discovery: a Service's EndpointSlices, or pods by label, by list+watch.

Client: kubernetes_asyncio. It runs on aiohttp (the gateway's own HTTP client, so no
second HTTP stack), loads both in-cluster config (service account token, re-read as it
rotates, and CA) and kubeconfig files, and its watch takes ``allowWatchBookmarks`` and a
server-side ``timeoutSeconds`` and surfaces a 410 Gone as an error (lightkube's watch can
ask for no bookmarks and reconnects by itself).

One cycle, repeated until cancelled::

    LIST (paged)                  -> the whole set; publish it (membership diffs it
                                     against the fleet, so a pod deleted while no watch
                                     ran is removed here)
    until resync_s passed:
      WATCH from the last resourceVersion, allowWatchBookmarks, timeoutSeconds <= 60
        ADDED / MODIFIED / DELETED -> update the set; publish it
        BOOKMARK                   -> only the resourceVersion moves on
      (the server ended the watch: watch again from where it got to; one it ended
      within MIN_WATCH_S with no event is an error, as client-go's reflector takes it,
      not a reason to watch again at once: a server or proxy that ends every watch so
      would otherwise be asked again as fast as it answers)
    LIST again: every resync_s (a watch that went silently stale cannot hide changes
    longer), at once after 410 Gone, after retry_s (doubling to 30 s, or to retry_s when
    that is longer) after any other error (a broken watch, a watch ended at once, a
    refused request)

A failed list or watch keeps the last set and is counted in ``SourceStats``. After a 401
the client is built again, its credentials loaded anew: a kubeconfig's (an exec plugin's
token, a ``tokenFile``) are read only when a client is built, and expire. An exec plugin
that gives no credential within ``EXEC_TIMEOUT_S`` (30 s) is killed, and counts as a
failure like any other (see exec_credential). The kubeconfig is loaded (its YAML parsed,
its files read, its plugin run) on a loop of its own in a worker thread (see own_loop).

What the event loop does per object, with thousands of them: a list page is decoded a
slice at a time and its objects turned into replicas a slice at a time, the loop handed
back between slices (see list_decode, loop_slices); a watch event is decoded once, and only the
object it names is worked out again (targets: ``slice_found``, ``pod_target``). Only what
an object gives is kept, not its JSON, and an event that changes nothing of it (a pod's
status, say) publishes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio import watch as k8s_watch
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config import kube_config as k8s_kube_config
from kubernetes_asyncio.config.exec_provider import ExecProvider

from gateway.config import ReplicaConfig
from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.exec_credential import ExecPluginError, run_exec_plugin
from gateway.discovery.list_decode import decode_list
from gateway.discovery.own_loop import on_own_loop
from gateway.discovery.stats import SourceStats
from gateway.discovery.targets import SliceFound, Targets, combined, pod_target, slice_found
from gateway.discovery.types import Publish
from gateway.loop_slices import each_handing_back

log = logging.getLogger("kvgate.discovery")

SERVICE_LABEL = "kubernetes.io/service-name"
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
PAGE = 500  # objects per list page
LIST_TIMEOUT_S = 30.0
WATCH_S = 60.0  # the longest one watch request may stay open (server side)
MAX_RETRY_S = 30.0  # the longest wait after failures, unless retry_s is longer
REFUSAL_BYTES = 64 << 10  # read of a refused request's answer
MIN_WATCH_S = 1.0  # a watch the server ends sooner, with no event, failed


class ShortWatch(Exception):
    """The server ended a watch at once with no event (see MIN_WATCH_S)."""


class BoundedExecProvider(ExecProvider):
    """The client's exec credential provider, its plugin run bounded (exec_credential)."""

    async def run(self, previous_response: str | None = None) -> Any:
        return await run_exec_plugin(self.args, self.env, str(self.api_version),
                                     previous_response)


# the kubeconfig loader looks the provider up in its module each time it runs a plugin
k8s_kube_config.ExecProvider = BoundedExecProvider  # type: ignore[misc]

Lister = Callable[..., Awaitable[Any]]
Found = SliceFound | ReplicaConfig | None  # what one slice, or one pod, gives


class RawWatch(k8s_watch.Watch):
    """The client's watch, each event's JSON decoded once: the library's decodes a line,
    encodes its object again and decodes that to build a model from it (``object``: the
    dict as it is); here the decoded line's object is the event's, as the client hands
    an object it has no model for.

    It holds the source's ApiClient, not one of its own: the library's Watch builds one,
    which loads an SSL context from the system's CA store (~20 ms with the event loop
    blocked), and a raw watch never uses it (it builds no models). Closing it releases
    its response only; the client stays the source's."""

    def __init__(self, api: k8s.ApiClient) -> None:  # Watch.__init__, with ``api``
        self._raw_return_type = "object"
        self._stop = False
        self._api_client = api
        self.resource_version = None
        self.resp = None

    def unmarshal_event(self, data: str | bytes, response_type: str | None) -> Any:
        return super().unmarshal_event(data, None)

    async def close(self) -> None:
        if self.resp is not None:
            self.resp.release()
            self.resp = None


async def _refusal(resp: aiohttp.ClientResponse) -> str:
    """What a refused request's answer says: its Status's reason and message (a 403 names
    the verb and resource RBAC did not grant), else the HTTP reason; read up to
    REFUSAL_BYTES."""
    raw = await resp.content.read(REFUSAL_BYTES)
    try:
        status = json.loads(raw)
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str):
        reason = status.get("reason") or resp.reason
        return f"{reason}: {status['message'][:REFUSAL_BYTES // 64]}"
    return str(resp.reason)


def _any_file(paths: str) -> bool:
    """Whether any of ``paths`` (a kubeconfig list, as $KUBECONFIG writes it) exists."""
    return any(os.path.exists(os.path.expanduser(path))
               for path in paths.split(k8s_kube_config.ENV_KUBECONFIG_PATH_SEPARATOR) if path)


class KubernetesSource:
    def __init__(self, config: KubernetesSourceConfig) -> None:
        self.config = config
        self.stats = SourceStats(config.label)
        self.objects: dict[str, Found] = {}  # slice or pod name -> what it gives
        self.resource_version: str | None = None
        self.events = 0  # watch events received, bookmarks included
        self._api: k8s.ApiClient | None = None
        self._watcher: RawWatch | None = None  # one for every watch (see watch)
        self._namespace = config.namespace or "default"
        self.selector = f"{SERVICE_LABEL}={config.service}" if config.service \
            else str(config.label_selector)

    @property
    def label(self) -> str:
        return self.config.label

    async def _client(self) -> k8s.ApiClient:
        if self._api is None:
            conf = k8s.Configuration()
            in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ \
                and self.config.kubeconfig is None and self.config.context is None
            if in_cluster:
                await asyncio.to_thread(k8s_config.load_incluster_config,
                                        client_configuration=conf)  # reads token and CA
                if self.config.namespace is None:
                    self._namespace = (await asyncio.to_thread(NAMESPACE_FILE.read_text)
                                       ).strip()
            else:
                # persist_config off: the library's writing back of a token its auth
                # provider refreshed (OIDC, GCP) raises TypeError (its persister takes no
                # argument), and would rewrite the operator's file (a mounted Secret:
                # read-only); the refreshed token is kept in memory, for this client
                paths = self.config.kubeconfig or k8s_kube_config.KUBE_CONFIG_DEFAULT_LOCATION
                try:
                    loader = await on_own_loop(k8s_config.load_kube_config(
                        config_file=paths, context=self.config.context,
                        client_configuration=conf, persist_config=False))
                except ConfigException as exc:
                    # no file at all reads as "Invalid kube-config ... current-context"
                    if not await asyncio.to_thread(_any_file, paths):
                        raise ConfigException(
                            f"no kubeconfig file at {paths!r} (the source's kubeconfig, "
                            "else $KUBECONFIG, else ~/.kube/config; in a pod with neither "
                            "kubeconfig nor context set, its service account)") from exc
                    raise
                if self.config.namespace is None:  # the context in use's, else default
                    context = (loader.current_context or {}).get("context") or {}
                    self._namespace = str(context.get("namespace") or "default")
            self._api = k8s.ApiClient(configuration=conf)
        return self._api

    def _lister(self, api: k8s.ApiClient) -> Lister:
        if self.config.service:
            return k8s.DiscoveryV1Api(api).list_namespaced_endpoint_slice
        return k8s.CoreV1Api(api).list_namespaced_pod

    def _found(self, obj: Mapping[str, Any]) -> Found:
        if self.config.service:
            return slice_found(self.config, obj)
        return pod_target(self.config, obj)

    def targets(self) -> Targets:
        """The replicas of every object found, with none built anew."""
        if self.config.service:
            return combined(f for f in self.objects.values() if isinstance(f, SliceFound))
        return {f.id: f for f in self.objects.values() if isinstance(f, ReplicaConfig)}

    async def list(self, lister: Lister) -> None:
        """Replace the whole set with a fresh (paged) list, and note its resourceVersion."""
        objects: dict[str, Found] = {}
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            resp = await lister(self._namespace, label_selector=self.selector, limit=PAGE,
                                _preload_content=False, _request_timeout=LIST_TIMEOUT_S,
                                **extra)
            try:
                if not 200 <= resp.status < 300:  # unread content: the client raised nothing
                    raise ApiException(status=resp.status, reason=await _refusal(resp))
                # aiohttp checks the Content-Type, strips and decodes the text (loads=str
                # hands it back as is); the JSON, MBs of it, is decoded a slice at a time
                text = await resp.json(loads=str)
                body: Any = None if text is None else await decode_list(text)
            finally:
                resp.release()
            items = body.get("items") or []
            async for item in each_handing_back(items):
                objects[item["metadata"]["name"]] = self._found(item)
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                self.objects = objects
                self.resource_version = str(meta["resourceVersion"])
                self.stats.relists += 1
                return

    async def watch(self, lister: Lister, publish: Publish, seconds: float) -> None:
        """Follow changes from ``resource_version`` until the server ends the watch (asked
        to after ``seconds``; the client gives up 30 s later); ApiException(410) when
        that version is gone."""
        if self._watcher is None:  # one for every watch of this client
            self._watcher = RawWatch(await self._client())
        watcher = self._watcher
        loop = asyncio.get_running_loop()
        started, events = loop.time(), self.events
        try:
            stream = watcher.stream(
                lister, self._namespace, label_selector=self.selector,
                resource_version=self.resource_version, allow_watch_bookmarks=True,
                timeout_seconds=max(1, int(seconds)),
                _request_timeout=aiohttp.ClientTimeout(total=seconds + 30, sock_connect=10))
            async for event in stream:
                self.events += 1
                kind, obj = event["type"], event["raw_object"]
                self.resource_version = watcher.resource_version or self.resource_version
                if kind == "BOOKMARK":
                    continue
                name = obj["metadata"]["name"]
                if kind == "DELETED":
                    if self.objects.pop(name, None) is None:
                        continue  # it gave no replica (or was never listed)
                elif kind in ("ADDED", "MODIFIED"):
                    found = self._found(obj)
                    if found == self.objects.get(name):
                        # nothing of it that makes a replica changed: the config objects
                        # kept, which membership passes over as the same ones
                        continue
                    self.objects[name] = found
                else:
                    log.info("discovery %s: watch event %r ignored", self.label, kind)
                    continue
                await self._publish(publish)
        finally:
            await watcher.close()
        if self.events == events and loop.time() - started < MIN_WATCH_S:
            raise ShortWatch(f"the server ended the watch within {MIN_WATCH_S:g} s, "
                             "with no event")

    async def _publish(self, publish: Publish) -> None:
        targets = self.targets()
        await publish(targets)
        self.stats.synced(len(targets))

    async def run(self, publish: Publish) -> None:
        delay = self.config.retry_s
        longest = max(MAX_RETRY_S, self.config.retry_s)  # never below what was set
        quick_relist = True  # after a 410: at once, unless the last watch got nothing
        while True:
            events = self.events
            try:
                lister = self._lister(await self._client())
                await self.list(lister)
                await self._publish(publish)
                loop = asyncio.get_running_loop()
                resync_at = loop.time() + self.config.resync_s
                while (left := resync_at - loop.time()) > 0:
                    await self.watch(lister, publish, min(WATCH_S, left))
                    delay, quick_relist = self.config.retry_s, True
                continue  # time for a full list
            except ApiException as exc:
                if exc.status == 410 and (quick_relist or self.events > events):
                    self.stats.gone += 1
                    quick_relist = False
                    log.info("discovery %s: watch answered 410 Gone; listing again",
                             self.label)
                    continue
                error = f"API answered {exc.status}: {exc.reason}"
                if exc.status == 401:  # credentials expired: load them again next time
                    await self.close()
            except (aiohttp.ClientError, TimeoutError, ConfigException, ExecPluginError,
                    OSError, ShortWatch) as exc:
                error = f"{exc.__class__.__name__}: {exc}"
            except Exception as exc:  # a malformed answer (the client raises bare Exception)
                error = f"unexpected answer: {exc.__class__.__name__}: {exc}"
            self.stats.failed(error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    async def close(self) -> None:
        if self._watcher is not None:
            await self._watcher.close()
            self._watcher = None
        if self._api is not None:
            await self._api.close()
            self._api = None
