"""Kubernetes discovery with a kubeconfig ``exec`` credential plugin that never answers:
a real plugin (a shell script) run by the real kubernetes_asyncio loader, against the
stand-in API server (tests.support.fake_kube_api)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gateway.discovery import exec_credential
from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.kube_source import KubernetesSource
from gateway.discovery.targets import Targets
from tests.support.fake_kube_api import FakeKubeAPI, endpoint, endpoint_slice, kubeconfig
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until_async

Serve = Callable[..., ThreadServer]

# writes its pid, then hangs (exec: the pid stays the sleeper's) until the file ``ok`` is
# there; from then on it answers with a token
PLUGIN = """#!/bin/sh
echo $$ >> '{pids}'
if [ -e '{ok}' ]; then
  echo '{{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
         "status": {{"token": "from-plugin"}}}}'
  exit 0
fi
exec sleep 600
"""


def reaped(pid: int) -> bool:
    """No such process: it ended and its parent collected it (a zombie still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Plugin:
    def __init__(self, tmp_path: Path) -> None:
        self.pids_file, self.ok = tmp_path / "pids", tmp_path / "ok"
        self.path = tmp_path / "hanging-credential-plugin"
        self.path.write_text(PLUGIN.format(pids=self.pids_file, ok=self.ok))
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    def pids(self) -> list[int]:
        if not self.pids_file.exists():
            return []
        return [int(line) for line in self.pids_file.read_text().split()]

    def kill_all(self) -> None:  # what a failing test left running
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def source_with(plugin: Plugin, api: ThreadServer, tmp_path: Path) -> KubernetesSource:
    config = kubeconfig(api.url, namespace="llm")
    config["users"] = [{"name": "test", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin.path),
        "interactiveMode": "Never"}}}]
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http", kubeconfig=str(path), retry_s=0.05,
        resync_s=3600))


async def test_a_hanging_exec_plugin_is_killed_counted_and_retried(
        serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # the plugin ran with no time limit: one that never exited stalled discovery for good,
    # nothing counted, nothing logged, the fleet never found
    monkeypatch.setattr(exec_credential, "EXEC_TIMEOUT_S", 0.2)
    api = FakeKubeAPI()
    server = serve(api.app())
    api.put(endpoint_slice("llm", "s", "vllm", 8000, [endpoint("10.0.0.1", "vllm-a")]))
    plugin = Plugin(tmp_path)
    source = source_with(plugin, server, tmp_path)
    published: list[Targets] = []

    async def publish(targets: Targets) -> None:
        published.append(targets)

    caplog.set_level(logging.WARNING, "kvgate.discovery")
    task = asyncio.create_task(source.run(publish))
    try:
        await wait_until_async(lambda: source.stats.failures >= 2, 5,
                               "two runs of the plugin to time out")
        error = source.stats.last_error
        assert error is not None and str(plugin.path) in error and "0.2 s" in error, error
        assert any(str(plugin.path) in r.getMessage() and "0.2 s" in r.getMessage()
                   for r in caplog.records if r.name == "kvgate.discovery")
        first = plugin.pids()[0]
        assert reaped(first), f"plugin {first} still there after its timeout"
        assert api.requests == [] and published == []

        plugin.ok.touch()  # the plugin answers again: the next retry finds the fleet
        await wait_until_async(lambda: published and "vllm-a" in published[-1], 5,
                               "the fleet, with the plugin's token")
        assert api.authorizations[0] == "Bearer from-plugin"
        assert source.stats.last_error is None
        assert all(reaped(pid) for pid in plugin.pids())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.close()
        plugin.kill_all()


async def test_a_plugin_running_when_discovery_stops_is_killed(
        serve: Serve, tmp_path: Path) -> None:
    # discovery stopped (the gateway shutting down) while the plugin ran: the plugin was
    # left running, orphaned
    api = FakeKubeAPI()
    server = serve(api.app())
    plugin = Plugin(tmp_path)
    source = source_with(plugin, server, tmp_path)

    async def publish(targets: Targets) -> None:
        return None

    task = asyncio.create_task(source.run(publish))
    try:
        pids = await wait_until_async(plugin.pids, 5, "the plugin to start")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert reaped(pids[0]), f"plugin {pids[0]} still running after discovery stopped"
        assert source.stats.failures == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.close()
        plugin.kill_all()
