"""A real DNS server on loopback (dnslib, UDP) whose A/AAAA records a test changes while
it runs, or tells to fail (SERVFAIL) or to say a name does not exist (NXDOMAIN)."""

from __future__ import annotations

import ipaddress
import threading
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class _Records(BaseResolver):  # type: ignore[misc]
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.addresses: dict[str, list[str]] = {}  # name (no trailing dot) -> addresses
        self.rcode: int | None = None  # answer every question with this code when set
        self.questions = 0

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        name = str(request.q.qname).rstrip(".")
        qtype = QTYPE[request.q.qtype]
        with self.lock:
            self.questions += 1
            if self.rcode is not None:
                reply.header.rcode = self.rcode
                return reply
            if name not in self.addresses:
                reply.header.rcode = RCODE.NXDOMAIN
                return reply
            for address in self.addresses[name]:
                version = ipaddress.ip_address(address).version
                if qtype == "A" and version == 4:
                    reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=1))
                elif qtype == "AAAA" and version == 6:
                    reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(address),
                                        ttl=1))
        return reply


class FakeDNS:
    """``set(name, [addresses])``, ``fail()`` (SERVFAIL), ``recover()``; ``port``."""

    def __init__(self) -> None:
        self.records = _Records()
        self.server = DNSServer(self.records, port=0, address="127.0.0.1",
                                logger=DNSLogger("-request,-reply,-truncated,-error,-recv,"
                                                 "-send,-data", prefix=False))
        self.port = int(self.server.server.server_address[1])

    def start(self) -> FakeDNS:
        self.server.start_thread()
        return self

    def stop(self) -> None:
        self.server.stop()
        self.server.server.server_close()

    def set(self, name: str, addresses: list[str]) -> None:
        with self.records.lock:
            self.records.addresses[name] = list(addresses)

    def fail(self) -> None:
        with self.records.lock:
            self.records.rcode = RCODE.SERVFAIL

    def recover(self) -> None:
        with self.records.lock:
            self.records.rcode = None

    @property
    def questions(self) -> int:
        with self.records.lock:
            return self.records.questions
