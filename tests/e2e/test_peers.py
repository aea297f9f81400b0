"""Two ``kvgate serve`` gateways in front of one replica, peered (``gateway.peers``), each
one process or two workers: a request through one raises the queue the other sees for its
replica before the first byte returns, and both let go of it once answered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.held_streams import held_stream
from tests.support.metrics import Samples, per_worker, samples
from tests.support.processes import Processes
from tests.support.servers import ThreadServer, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

SECRET = "peer-secret-for-tests-0123"


def _metrics(url: str) -> dict[Any, float]:
    return samples(httpx.get(f"{url}/metrics", headers={"connection": "close"}).text)


def _replica(url: str, name: str) -> float | None:
    return _metrics(url).get((name, (("replica", "r0"),)))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_copy_sees_the_request_another_copy_holds_at_a_replica(
        spawn: Processes, serve: Callable[..., ThreadServer], tmp_path: Path,
        workers: int) -> None:
    behaviour = Behaviour("r0", chunks=2)
    replica = serve(fake_replica(behaviour))
    ports = [free_port() for _ in range(2)]
    peer_ports = [free_port() for _ in range(2)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for i in range(2):
        config = tmp_path / f"gateway{i}.yaml"
        config.write_text(yaml.safe_dump({
            "port": ports[i], "policy": {"name": "cost"},
            "replicas": [{"id": "r0", "url": replica.url}],
            "health": {"interval_s": 0.2},
            "shutdown": {"grace_s": 0},  # no load balancer to tell: stop at once
            # each lists both copies, itself included, as a headless Service would
            "peers": {"listen": f"127.0.0.1:{peer_ports[i]}",
                      "addresses": [f"127.0.0.1:{p}" for p in peer_ports],
                      "secret": SECRET}}))
        spawn("serve", "--config", str(config), "--workers", str(workers),
              ready_url=f"{urls[i]}/ready")

    def linked(got: Samples) -> bool:
        """Every worker's link out is up, and every link in from the other copy's workers
        (summed over this box's workers, whichever answers)."""
        return got.get(("kvgate_peer_links_up", ())) == workers \
            and got.get(("kvgate_peer_links_in", ())) == workers

    for url in urls:  # one link out each: the one to its own box is found and dropped
        per_worker(url, linked, f"{url} to link with the other", workers)

    with held_stream(behaviour, urls[0]) as chunks:
        # the replica holds its first byte: the copy that did not route it counts it too
        wait_until(lambda: _replica(urls[1], "kvgate_replica_in_flight") == 1
                   and (_replica(urls[1], "kvgate_replica_queued_tokens") or 0) > 200,
                   20, "the other copy to see the request held at r0")
        assert _replica(urls[1], "kvgate_replica_queued_tokens") == \
            _replica(urls[0], "kvgate_replica_queued_tokens")
        assert not chunks  # no byte had come back
    assert chunks == ["t0 ", "t1 "]
    wait_until(lambda: _replica(urls[1], "kvgate_replica_in_flight") == 0
               and _replica(urls[1], "kvgate_replica_queued_tokens") == 0,
               20, "the other copy to see it answered")
    # its SENT, FIRST_BYTE, DONE and ROUTED frames (heartbeats are not counted), summed
    # over the workers (each counts those its links in received) whichever answers
    frames = per_worker(urls[1], lambda s: s.get(("kvgate_peer_frames_received_total", ()),
                                                 0) >= 4,
                        "every worker to show the box's frames received", workers)
    assert len(frames) == workers
