"""The routes a worker skips because they name a replica its fleet does not hold (removed
a moment before the route was told) are exported as ``kvgate_worker_routes_unknown``,
beside the other counts of the routes told between workers."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from tests.support.route_documents import document, paired_workers


def test_a_route_to_a_replica_the_fleet_does_not_hold_is_counted_on_the_page() -> None:
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:9000")])
    metrics = GatewayMetrics(fleet)

    async def run() -> bytes:
        sender, reader = paired_workers(b_fleet=fleet)
        metrics.watch_worker_routes(reader)
        try:
            sender.routed(document(1), "gone")  # removed before the route was told
            sender.routed(document(2), "r0")
            sender.send_waiting()
            reader.catch_up()
            return await metrics.page()
        finally:
            reader.stop()
            sender.stop()

    page = asyncio.run(run())
    got = {s.name: s.value for family in text_string_to_metric_families(page.decode())
           for s in family.samples if s.name.startswith("kvgate_worker_routes")}
    assert got["kvgate_worker_routes_unknown_total"] == 1.0
    assert got["kvgate_worker_routes_received_total"] == 2.0
