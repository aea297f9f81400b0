"""A gateway configured with ``tls: {ca_file}`` health-checks an https replica signed by
that private CA with it too, not only its proxied requests: the replica is healthy and
served (its checks trusted only the system's CAs, so it was ejected)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.support.gateway_harness import AUTH, Serve, start_gateway
from tests.support.private_ca import Certs, https_replica, make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("s37s_ca"))


async def _replica_state(admin: str) -> dict[str, object]:
    async with httpx.AsyncClient() as client:
        listed = (await client.get(f"{admin}/admin/replicas", headers=AUTH)).json()
    state: dict[str, object] = listed["replicas"][0]
    return state


async def test_health_checks_trust_the_configured_ca(certs: Certs, serve: Serve) -> None:
    async with https_replica(certs) as url:
        gw = await asyncio.to_thread(start_gateway, serve, [("r0", url)],
                                     tls={"ca_file": str(certs.ca)})
        # checked every 0.2 s: a replica the checks cannot trust is ejected at its first
        # check and stays out; one they trust is healthy once checked and stays in
        deadline = time.monotonic() + 20
        state = await _replica_state(gw.admin)
        while state["healthy"] is not True and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            state = await _replica_state(gw.admin)
        for _ in range(5):
            await asyncio.sleep(0.2)
            state = await _replica_state(gw.admin)
            assert state["healthy"] is True, state
        # (its /metrics is a 404: the scrape's complaint, not a certificate's)
        assert "certificate" not in str(state.get("last_error")), state
