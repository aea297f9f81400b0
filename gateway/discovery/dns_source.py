"""DNS discovery: a headless Service's A (else AAAA) records, re-resolved every ``interval_s``.

Resolved with dnspython's asyncio resolver (pure Python, on the event loop, never
blocking it; nameservers and their port can be set, which the tests need). It asks the
DNS servers themselves (``/etc/resolv.conf``'s, else ``nameservers``), never
``/etc/hosts``: a name that only the hosts file holds is NXDOMAIN, and says so. A lookup that
fails, or that finds no address at all, keeps the last set: a DNS outage never empties
the fleet. It is counted and logged (``SourceStats``). A replica missing from an answer
is removed once it is missing from ``remove_after`` answers in a row (``RemovalGrace``).
"""

from __future__ import annotations

import asyncio

import dns.asyncresolver
import dns.exception
import dns.resolver

from gateway.discovery.config import DNSSourceConfig
from gateway.discovery.removal_grace import RemovalGrace
from gateway.discovery.stats import SourceStats
from gateway.discovery.targets import Targets, dns_targets
from gateway.discovery.types import Publish
from policies.config import ConfigError


class DNSLookupFailed(Exception):
    pass


class DNSSource:
    def __init__(self, config: DNSSourceConfig) -> None:
        self.config = config
        self.stats = SourceStats(config.label)
        self._grace = RemovalGrace(config.remove_after)
        if config.nameservers:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = list(config.nameservers)
            self._resolver.port = config.nameserver_port
        else:
            try:
                self._resolver = dns.asyncresolver.Resolver()  # reads /etc/resolv.conf once
            except dns.resolver.NoResolverConfiguration as exc:
                raise ConfigError(f"discovery {config.label}: the system names no DNS "
                                  f"server ({exc}); set nameservers") from exc

    @property
    def label(self) -> str:
        return self.config.label

    async def addresses(self) -> list[str]:
        """The name's addresses of the first of ``record_types`` it has records of (a
        dual-stack pod has an A and an AAAA record: both would count one engine twice), or
        of every type with ``all_record_types``;
        DNSLookupFailed when a lookup fails or none has any (a name that does not exist
        counts as failed, not as an empty fleet)."""
        found: list[str] = []
        for record_type in self.config.record_types:
            if found and not self.config.all_record_types:
                break
            try:
                answer = await self._resolver.resolve(
                    self.config.name, record_type, search=True,
                    lifetime=self.config.timeout_s)
            except dns.resolver.NoAnswer:
                continue  # the name exists, with no record of this type
            except dns.resolver.NXDOMAIN as exc:
                raise DNSLookupFailed(f"{record_type} {self.config.name}: "
                                      f"{exc.__class__.__name__}: {exc} ({self._asked()})"
                                      ) from exc
            except dns.exception.DNSException as exc:
                raise DNSLookupFailed(f"{record_type} {self.config.name}: "
                                      f"{exc.__class__.__name__}: {exc}") from exc
            found.extend(str(record.address) for record in answer)
        if not found:
            raise DNSLookupFailed(f"{self.config.name} has no "
                                  f"{'/'.join(self.config.record_types)} record")
        return found

    def _asked(self) -> str:
        """Whom a lookup asks: the DNS servers themselves, never the hosts file."""
        servers = ", ".join(str(server) for server in self._resolver.nameservers)
        return (f"asked DNS server {servers} port {self._resolver.port} directly; "
                "/etc/hosts is not read, so a name only it holds (localhost) is not found")

    async def run(self, publish: Publish) -> None:
        """Resolve, publish, sleep; until cancelled."""
        while True:
            try:
                targets: Targets = self._grace.apply(
                    dns_targets(self.config, await self.addresses()))
            except DNSLookupFailed as exc:
                self.stats.failed(str(exc))
            else:
                await publish(targets)
                self.stats.synced(len(targets))
            await asyncio.sleep(self.config.interval_s)

    async def close(self) -> None:
        return None
