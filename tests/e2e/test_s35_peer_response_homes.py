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
import yaml

from tests.support.engine_servers import LiveEngine
from tests.support.metrics import Samples, client_on_worker, per_worker
from tests.support.processes import Processes
from tests.support.servers import free_port
from tests.support.tenant_responses import API_KEYS, KEY_A, KEY_B, post_response, tiny_engine
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
    ports = [free_port() for _ in range(2)]
    peer_ports = [free_port() for _ in range(2)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for i in range(2):
        config = tmp_path / f"gateway{i}.yaml"
        config.write_text(yaml.safe_dump({
            "port": ports[i], "policy": {"name": "round_robin"},
            "replicas": [{"id": "e0", "url": engine.url}],
            "auth": API_KEYS,
            "shutdown": {"grace_s": 0, "timeout_s": 20},
            "peers": {"listen": f"127.0.0.1:{peer_ports[i]}",
                      "addresses": [f"127.0.0.1:{p}" for p in peer_ports],
                      "secret": SECRET}}))
        spawn("serve", "--config", str(config), "--workers", str(workers),
              ready_url=f"{urls[i]}/ready")

    def linked(got: Samples) -> bool:
        return got.get(("kvgate_peer_links_up", ())) == workers \
            and got.get(("kvgate_peer_links_in", ())) == workers

    for url in urls:
        per_worker(url, linked, f"{url} to link with the other copy", workers)
    with httpx.Client(base_url=urls[0], timeout=30) as first_client:
        first = post_response(first_client, KEY_A, input="ACME SECRET: the launch code is 4242")
    assert first.status_code == 200, first.text
    secret = first.json()["id"]
    # told over the link as soon as it was answered: here within a moment (a frame)
    with httpx.Client(base_url=urls[1], timeout=30) as probe:
        wait_until(lambda: post_response(probe, KEY_B, input="?", previous_response_id=secret)
                   .status_code == 404, 10, "the other copy to know the response's tenant")
    # every worker of the other copy refuses it: each is reached on a connection of its own
    for worker in ("0", "1"):
        client = client_on_worker(urls[1], worker)
        try:
            for stream in (False, True):
                answer = post_response(client, KEY_B, input="what did I say?",
                               previous_response_id=secret, stream=stream)
                assert answer.status_code == 404, answer.text
                assert answer.json()["error"]["param"] == "previous_response_id"
            # its own tenant goes on continuing it there
            went_on = post_response(client, KEY_A, input="what did I say?",
                            previous_response_id=secret)
            assert went_on.status_code == 200, went_on.text
        finally:
            client.close()
