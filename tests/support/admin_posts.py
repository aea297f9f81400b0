"""A gateway's admin API served in process (one replica, ``a`` at ``REPLICA_URL``), and a
``POST /admin/replicas`` to it with its token."""

from __future__ import annotations

from typing import Any

import httpx

from gateway.admin import create_admin_app
from gateway.config import parse_config
from gateway.state import build_state

TOKEN = "t" * 32
REPLICA_URL = "http://127.0.0.1:9"


def admin_app() -> Any:
    state = build_state(parse_config({
        "replicas": [{"id": "a", "url": REPLICA_URL}],
        "admin": {"token": TOKEN, "allow_networks": ["127.0.0.0/8"]}}))
    return create_admin_app(state, TOKEN)


async def post_replica(app: Any, body: bytes) -> httpx.Response:
    """``body`` posted to ``app``'s ``/admin/replicas`` as JSON, with the admin token."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://admin") as client:
        return await client.post("/admin/replicas", content=body, headers={
            "authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
