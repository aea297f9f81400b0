"""Owns the discovery sources' tasks: started and stopped in the app's lifespan.

Each source runs in a task of its own and hands every set it finds to
``gateway.membership.reconcile`` under its label, one set at a time; a replica in it that
no replica may be (``replica_checks``) is left out, and counted in the source's stats. A
source whose task ends with an error (a bug: sources retry their own failures) is logged
and restarted.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.discovery.config import DiscoverySourceConfig, DNSSourceConfig
from gateway.discovery.stats import SourceStats
from gateway.discovery.targets import Targets
from gateway.discovery.types import Publish, Source
from gateway.membership import reconcile
from gateway.periodic import stop_tasks
from gateway.state import GatewayState
from policies.config import ConfigError

log = logging.getLogger("kvgate.discovery")

RESTART_S = 5.0


def build_source(config: DiscoverySourceConfig) -> Source:
    """The source for a config. A Kubernetes source needs the ``kubernetes`` extra;
    without it, ConfigError says how to install it."""
    if isinstance(config, DNSSourceConfig):
        from gateway.discovery.dns_source import DNSSource

        return DNSSource(config)
    try:
        from gateway.discovery.kube_source import KubernetesSource
    except ImportError as exc:
        raise ConfigError(f"discovery {config.label} needs kubernetes_asyncio ({exc}): "
                           "pip install 'kvgate[kubernetes]'") from exc
    return KubernetesSource(config)


class Discovery:
    def __init__(self, gw: GatewayState, sources: list[Source]) -> None:
        self.gw = gw
        self.sources = sources
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def stats(self) -> list[SourceStats]:
        return [source.stats for source in self.sources]

    def _publisher(self, source: Source) -> Publish:
        async def publish(targets: Targets) -> None:
            await reconcile(self.gw, source.label, targets, source.stats)

        return publish

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._keep_running(source),
                                           name=f"kvgate-discovery-{source.label}")
                       for source in self.sources]

    async def _keep_running(self, source: Source) -> None:
        publish = self._publisher(source)
        while True:
            try:
                await source.run(publish)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one source must not end discovery for good
                log.exception("discovery %s stopped; restarting in %s s", source.label,
                              RESTART_S)
            await asyncio.sleep(RESTART_S)

    async def stop(self) -> None:
        await stop_tasks(self._tasks)
        self._tasks = []
        for source in self.sources:
            await source.close()
