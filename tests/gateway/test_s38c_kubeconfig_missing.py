"""A Kubernetes source whose kubeconfig file does not exist says so, naming the path it
looked for (the library's own error spoke of an invalid file and its current-context)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.kube_source import KubernetesSource
from gateway.discovery.targets import Targets
from tests.support.fake_kube_api import source_running, write_kubeconfig
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async


async def _first_error(kubeconfig: str) -> str:
    source = KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http", kubeconfig=kubeconfig, retry_s=3600))
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: source.stats.failures >= 1, 10, "a failed list")
    assert published == []
    return str(source.stats.last_error)


async def test_a_missing_kubeconfig_is_named(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = str(tmp_path / "nowhere" / "config")
    error = await _first_error(missing)
    assert f"no kubeconfig file at {missing!r}" in error, error
    assert "current-context" not in error, error
    # a file that exists but fails to load keeps the library's own reason
    present = write_kubeconfig(tmp_path, f"http://127.0.0.1:{free_port()}", "llm")
    assert "no kubeconfig file" not in await _first_error(present)
