"""The Kubernetes source's waits after failed lists: from ``retry_s``, doubling, never
shorter than ``retry_s``. The real kubernetes_asyncio client against an API address that
refuses connections; the source's sleeps are noted (and not slept)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway.discovery import kube_source
from gateway.discovery.config import KubernetesSourceConfig
from gateway.discovery.kube_source import KubernetesSource
from gateway.discovery.targets import Targets
from tests.support.fake_kube_api import source_running, write_kubeconfig
from tests.support.servers import free_port
from tests.support.waiting import wait_until_async


async def _waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_s: float,
                 count: int) -> list[float]:
    """The source's first ``count`` waits after failed lists, with ``retry_s``."""
    waits: list[float] = []
    sleep = asyncio.sleep

    async def noted(delay: float) -> None:
        waits.append(delay)
        await sleep(0)

    # the source's own module sees a sleep that notes its delay; nothing else does
    names = {name: getattr(asyncio, name) for name in dir(asyncio) if not name.startswith("__")}
    monkeypatch.setattr(kube_source, "asyncio", SimpleNamespace(**(names | {"sleep": noted})))
    path = write_kubeconfig(tmp_path, f"http://127.0.0.1:{free_port()}", "llm")
    source = KubernetesSource(KubernetesSourceConfig(
        service="vllm", port_name="http", kubeconfig=path, retry_s=retry_s, resync_s=3600))
    published: list[Targets] = []
    async with source_running(source, published):
        await wait_until_async(lambda: len(waits) >= count, 10, f"{count} failed lists")
    assert source.stats.failures >= count
    assert not published
    return waits[:count]


async def test_a_retry_s_above_30_s_is_never_cut_to_30_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the wait doubled "up to 30 s": with retry_s 60, the second and later waits were 30 s,
    # half what the operator set
    assert await _waits(tmp_path, monkeypatch, 60.0, 4) == [60.0] * 4


async def test_the_wait_doubles_from_retry_s_up_to_30_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert await _waits(tmp_path, monkeypatch, 4.0, 6) == [4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
