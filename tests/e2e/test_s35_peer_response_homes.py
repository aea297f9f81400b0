"""Peered gateway copies keep a stored response its tenant's: the copy that saw it answered
tells its peers the replica and tenant, so another tenant's ``previous_response_id`` is
refused by whichever copy (and, with ``--workers``, whichever worker of it) the
continuation reaches. Without ``tenancy.isolate`` no salt reaches the replica, which
would continue any tenant's stored response (vLLM's does, and this engine's without a
salt): the copies are what keep it its tenant's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.engine_servers import LiveEngine
from tests.support.metrics import client_on_worker
from tests.support.peered_gateways import start_peered_pair
from tests.support.processes import Processes
from tests.support.tenant_responses import (
    API_KEYS,
    KEY_B,
    post_response,
    refused_to_the_other_tenant,
    stored_secret,
    tiny_engine,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SECRET = "peer-secret-for-tests-0123"


@pytest.fixture
def engine() -> Iterator[LiveEngine]:
    yield from tiny_engine()


def test_another_copys_tenant_cannot_continue_a_stored_response(
        spawn: Processes, engine: LiveEngine, tmp_path: Path) -> None:
    # two workers a copy: the frame reaches one worker of the other copy, which tells its
    # box's other worker
    workers = 2
    urls = start_peered_pair(spawn, tmp_path, {
        "policy": {"name": "round_robin"}, "replicas": [{"id": "e0", "url": engine.url}],
        "auth": API_KEYS, "shutdown": {"grace_s": 0, "timeout_s": 20}}, workers)
    with httpx.Client(base_url=urls[0], timeout=30) as first_client:
        secret = stored_secret(first_client).json()["id"]
    # told over the link as soon as it was answered: here within a moment (a frame)
    with httpx.Client(base_url=urls[1], timeout=30) as probe:
        wait_until(lambda: post_response(probe, KEY_B, input="?", previous_response_id=secret)
                   .status_code == 404, 10, "the other copy to know the response's tenant")
    # every worker of the other copy refuses it: each is reached on a connection of its own
    for worker in ("0", "1"):
        client = client_on_worker(urls[1], worker)
        try:
            # and its own tenant goes on continuing it there
            refused_to_the_other_tenant(client, secret)
        finally:
            client.close()


def test_a_copy_started_later_is_told_the_responses_answered_before(
        spawn: Processes, engine: LiveEngine, tmp_path: Path) -> None:
    answered: list[str] = []

    def answer_first(url: str) -> None:  # on the first copy, before the second is up
        with httpx.Client(base_url=url, timeout=30) as first_client:
            answered.append(stored_secret(first_client).json()["id"])

    urls = start_peered_pair(spawn, tmp_path, {
        "policy": {"name": "round_robin"}, "replicas": [{"id": "e0", "url": engine.url}],
        "auth": API_KEYS, "shutdown": {"grace_s": 0, "timeout_s": 20}},
        before_second=answer_first)
    # told when the first copy's link to it came up: here within a moment of it
    with httpx.Client(base_url=urls[1], timeout=30) as probe:
        wait_until(lambda: post_response(probe, KEY_B, input="?",
                                         previous_response_id=answered[0])
                   .status_code == 404, 10, "the later copy to know the response's tenant")
        refused_to_the_other_tenant(probe, answered[0])
